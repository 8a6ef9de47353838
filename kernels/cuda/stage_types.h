// What every stage of the CUDA backend shares (layer_stages.h): the batch's parameters
// (BatchParams), the stage ids in pass order (StageId), what changes from pass to pass
// (PassArgs), every array the stages read and write (BatchArrays, with each one's size),
// and CKV_HD, which makes a function __host__ __device__ under nvcc and inline elsewhere.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CKV_HD __host__ __device__ __forceinline__
#else
#define CKV_HD inline
#endif

namespace centroidkv::cuda {

// Element types of the staged input (the values of centroidkv::DType).
enum InputType : int32_t { kInputF32 = 0, kInputF16 = 1, kInputBF16 = 2 };

// Shape and options shared by every job of a batch (jobs batch together only when these
// agree, see layer_batch.h).
struct BatchParams {
  int32_t num_jobs = 0;
  int32_t heads = 0;       // H per job
  int32_t num_tokens = 0;  // n
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  int32_t input_type = kInputF32;
  int32_t token_major = 0;  // input layout of each job: [n, H, d] instead of [H, n, d]
  int32_t chunk = 0;        // C
  int32_t sink = 0;         // S
  int32_t recent = 0;       // W
  int32_t uniform = 1;
  int32_t max_passes = 1;
  int64_t target = 0;         // t
  int64_t slot_capacity = 0;  // source slots per head (n + 2 is always enough)
  int32_t match_tiles = 0;    // match with kMatchTiles (else kNormalize + kMatch)
  int32_t result_type = kInputF32;  // element type of the packed rows (an InputType)
  double bound = 0.0;         // MatchBound(key_dim), or TileMatchBound(key_dim) with tiles

  CKV_HD int64_t global_heads() const { return static_cast<int64_t>(num_jobs) * heads; }
};

// The stages (stage_layout.h to stage_emit.h), in the order a pass runs them (layer_batch.h:
// RunBatchStages).
// Matching runs either as kNormalize + kMatch (a warp per source on CUDA cores) or, when
// BatchParams::match_tiles, as kMatchTiles (tensor-core tiles, tile_match.h).
enum class StageId : uint8_t {
  kInit, kSetup, kNormalize, kMatch, kSelect, kMarkKept, kIndex, kBucket, kMerge, kOwner,
  kFinish, kEmit, kOffsets, kMatchTiles, kIndexCount, kIndexPrefix,
};

// What changes from pass to pass.
struct PassArgs {
  int32_t pass = 0;
  int32_t floor_on = 0;
  double floor = 0.0;       // tau + pass * delta when floor_on
  int32_t sink_output = 0;  // this pass writes the float32 output (the last pass)
};

// Every array the stages touch; device pointers on the GPU, host pointers on the host.
struct BatchArrays {
  // Inputs (staged contiguously, job after job, each in its own layout).
  const void* keys_in;          // [J][H * n * key_dim] of input_type
  const void* values_in;        // [J][H * n * value_dim]
  const uint32_t* counts_in;    // [J][H * n]
  const uint8_t* passthrough;   // [G]
  // Rows merged by earlier passes: two float64 buffers, ping-pong per head.
  double* state_keys[2];        // [G * n * key_dim]
  double* state_values[2];      // [G * n * value_dim]
  uint64_t* state_counts[2];    // [G * n]
  float* norm_keys;             // [G * n * key_dim]: rows normalised, as float (warp match)
  // Per head.
  int32_t* head_cur;            // 0: the input, 1 / 2: state buffer 0 / 1
  int32_t* head_length;         // current rows
  int32_t* head_active;         // this pass: compressed and longer than t
  int32_t* head_slots;          // this pass: source slots in use
  int32_t* head_candidates;     // this pass: candidate edges (atomic counter)
  int32_t* head_merges;         // this pass: r of the head
  int32_t* seg_begin;           // [G]: the head's slots to sort this pass
  int32_t* seg_end;             // [G]
  int64_t* out_offsets;         // [G + 1]: packed first row of each head
  // Per job.
  int32_t* job_done;            // no more passes
  int32_t* job_passes;          // passes that merged something
  int32_t* job_output_written;  // a last pass wrote the job's float output
  // Per source slot [G * slot_capacity].
  int32_t* edge_dest;           // destination row, -1 when none
  double* edge_score;           // exact float64 score of the edge
  uint8_t* edge_kept;
  uint64_t* sort_keys_in;       // OrderKey(score) for candidates, 0 otherwise
  int32_t* sort_values_in;      // the slot
  uint64_t* sort_keys_out;
  int32_t* sort_values_out;     // slots in the reference's top-r order, per head
  int32_t* bucket_next;         // next kept source (slot) of the same destination, -1: end
  int32_t* match_count;         // tile match: near ties listed (kTieOverflow: too many)
  int32_t* match_ties;          // [G * slot_capacity * kMaxTies]: their destinations (k)
  // Per row [G * n].
  int32_t* index_blocks;        // [G * IndexBlocks]: kept sources in / before each block
  int32_t* new_index;           // row after this pass's compaction, -1 when merged away
  int32_t* bucket_head;         // first kept source (slot) merging into this row, -1: none
  int32_t* owner;               // current row of each input entry (the assignment)
  void* packed_keys;            // [total * key_dim] of result_type: final rows, heads
  void* packed_values;          // [total * value_dim]                  concatenated
  uint32_t* packed_counts;      // [total]
};

}  // namespace centroidkv::cuda
