// One Compress() call of the CPU engine: the passes of SPEC.md section 2 over one layer,
// as oneTBB tasks over heads x chunks (see cpu_engine.h for the design).
//
// Rows between passes: a head starts on the caller's input rows (any dtype, fp8 codes with
// their head's scale included; either layout) and is read from there until its first merge;
// a pass that is not the last writes the compacted compressible rows in float64 (like the
// reference), later passes compact them in place. Protected rows (sinks and the recent
// window) are never merged, so they stay in the input for every pass: no pass copies or
// moves them, which for small jobs of many passes (decode-time splices) was most of the work
// between the passes. The last pass writes the result rows into the
// CompressResult, in float32 or rounded once to the options' result_dtype (fp16 / bf16, or
// fp8 in the options' static scales): each chunk's float32 rows are staged in cache, then
// rounded and streamed to the result a few rows at a time (non-temporal stores: no read of
// the result memory; BlockWriter, block_writer.h).
//
// Its rooms: layer_job.cc, pass control (the pass loop, floors, merge counts, stop reasons,
// where each pass writes, the chunk tasks); layer_job_chunks.cc, one chunk's matching and
// merging and a head's end of pass; layer_job_output.cc, the result arrays and the rows
// streamed into them.
//
// Thread-compatible: one LayerJob per call; its tasks share the per-thread ChunkScratch pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "centroidkv/kernels/engine.h"
#include "kernels/cpu/block_writer.h"
#include "kernels/cpu/edge_decisions.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/soft_match.h"
#include "oneapi/tbb/enumerable_thread_specific.h"

namespace centroidkv::cpu {

// The same rows, numbered from row `first` (row 0 of the result is row `first` of `rows`).
RowBlock ShiftRows(const RowBlock& rows, int64_t first);

// Grows a scratch buffer to at least `size` elements (never shrinks it).
template <typename T>
void GrowScratch(std::vector<T>* buffer, size_t size) {
  if (buffer->size() < size) buffer->resize(size);
}

// Buffers of one worker thread, grown on demand and reused across chunks and jobs. A chunk
// task runs to completion without waiting on other tasks, so no two tasks share them.
struct ChunkScratch {
  ChunkMatcher matcher;
  std::vector<RowMatch> matches;
  std::vector<int32_t> bucket_offsets;  // [destinations + 1]: kept sources per destination
  std::vector<int32_t> bucket_cursor;
  std::vector<int32_t> bucket_slots;
  std::vector<MergeTerm> terms;
  std::vector<float> value_tile;  // the chunk's values as float (fused passes on the input)
  std::vector<double> staged;     // in-place passes: the chunk's surviving rows, keys then values
  std::vector<float> output_stage;  // last passes: the BlockWriters' buffers
  BlockWriter key_writer, value_writer;
};

// The pool's slots come from operator new, cache-line aligned (so threads' slots share no
// line), rather than oneTBB's cache_aligned_allocator: that one takes memory from tbbmalloc,
// which LeakSanitizer does not scan, so every buffer of an engine kept alive to the end of a
// process (a test's shared engines) was reported as leaked.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

using ScratchPool = tbb::enumerable_thread_specific<ChunkScratch, CacheLineAllocator<ChunkScratch>>;

class HeadPool;

// std::allocator, except that resize() leaves new elements default-initialised
// (uninitialised doubles) instead of zeroing them. A head's float64 rows are written in full
// (sinks, each chunk's survivors, recent rows) before any is read, and zeroing them first
// would sweep up to tens of megabytes per head per job for nothing.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <typename U>
  explicit DefaultInitAllocator(const DefaultInitAllocator<U>& /*other*/) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using RowStore = std::vector<double, DefaultInitAllocator<double>>;

class LayerJob {
 public:
  // Where a pass writes the rows of a head.
  enum class Sink : uint8_t {
    kOutput,      // into the CompressResult, in its dtype (the last pass)
    kFreshState,  // float64 into a new buffer (the head's first merge, not the last pass)
    kInPlace,     // float64, compacted in place (later passes)
  };

  // The state of one head across the passes of a job. Reused across jobs (HeadPool), so
  // Reset() keeps the vectors' memory (and some of their contents, see Reset).
  struct Head {
    void Reset();

    int32_t index = 0;
    bool passthrough = false;
    int64_t length = 0;
    // Whether the compressible rows are `keys` / `values` (float64, indexed by head row: the
    // store's rows below the sinks are never touched), else the input; the protected rows
    // are always the input's (InputKeys, RecentKeys).
    bool owned = false;
    RowStore keys;                 // [length - recent rows, key_dim] when owned
    RowStore values;               // [length - recent rows, value_dim] when owned
    std::vector<uint64_t> counts;  // [length]
    std::vector<uint64_t> next_counts;
    std::vector<int32_t> owner;  // [n]: current row of each input entry; empty = identity
    std::vector<int32_t> remap;  // [length]: this pass's new row of each row
    bool written = false;        // final rows already in the CompressResult

    // This pass.
    bool active = false;         // compressed and longer than the target
    int64_t begin = 0, end = 0;  // the compressible range
    int32_t num_chunks = 0;
    int64_t candidates = 0;
    int64_t merges = 0;
    Sink sink = Sink::kOutput;
    std::vector<Edge> edges;           // [num_chunks * slots]: the edge of every source
    std::vector<int64_t> chunk_start;  // [num_chunks + 1]: new row of each chunk's first survivor
    std::vector<int32_t> order;        // KeepBest scratch
  };

  // `heads` (may be null): where the job takes its per-head state from and returns it to.
  LayerJob(const KernelTable& kernels, ScratchPool* scratch, const LayerPlan& plan,
           const LayerView& layer, const CompressControl& control, CompressResult* out,
           HeadPool* heads = nullptr);
  ~LayerJob();
  LayerJob(const LayerJob&) = delete;
  LayerJob& operator=(const LayerJob&) = delete;

  absl::Status Run();

 private:
  struct Task {
    int32_t head;
    int32_t chunk;
  };

  // The rows of one chunk as MergeChunk reads them (row 0 = the chunk's first row), and
  // where it puts the surviving rows: float into the result (through BlockWriters), double
  // staged for an in-place pass.
  struct ChunkRows {
    RowBlock keys;
    RowBlock values;
    double* staged_keys;
    double* staged_values;
    BlockWriter* output_keys;
    BlockWriter* output_values;
  };

  // Starts the thread's BlockWriters on the result rows of head `head` from `out_row` on.
  void StartOutput(int32_t head, int64_t out_row, ChunkScratch& scratch) const;
  // Rows first .. first + count - 1 of `keys` / `values` as result rows out_row ... of head
  // `head` (the counts are the caller's), through the thread's BlockWriters.
  void WriteOutputRows(int32_t head, const RowBlock& keys, const RowBlock& values, int64_t first,
                       int64_t count, int64_t out_row) const;

  // Row sources of a head's current rows: Keys / Values hold its compressible rows (and,
  // when not owned, every row); InputKeys / InputValues the input's rows of the head (its
  // sinks); RecentKeys / RecentValues its recent window, rows length - recent .. length - 1,
  // indexed by head row (the input's last rows).
  RowBlock Keys(const Head& head) const;
  RowBlock Values(const Head& head) const;
  RowBlock InputKeys(const Head& head) const;
  RowBlock InputValues(const Head& head) const;
  RowBlock RecentKeys(const Head& head) const;
  RowBlock RecentValues(const Head& head) const;
  ExactScorer Scorer(const Head& head) const;
  int32_t ChunkLength(const Head& head, int32_t chunk) const;

  bool LoadHeads();  // false: a zero count, or a head's counts overflow uint32
  absl::Status BadInput() const;
  void CheckInputRows(bool (*chunked)(const Head&));
  bool SetUpPass(int32_t pass);
  void PredictMerges();
  void CountMerges();
  void ApplyUniformHeads();
  bool AllCandidatesKept() const;
  bool AnyMerges() const;
  void PrepareSinks(int32_t pass, bool fused);
  void AllocateOutput();
  void RunChunks(bool match, bool merge, bool fused);
  void SelectEdges();
  PrefetchRanges ChunkRanges(const Head& head, int32_t chunk, bool with_values) const;
  bool MatchChunk(Head& head, int32_t chunk, bool fused, bool check_keys,
                  const PrefetchRanges& next, ChunkScratch& scratch);
  void MergeChunk(Head& head, int32_t chunk, bool fused, ChunkScratch& scratch);
  void BucketSources(const Head& head, int32_t chunk, ChunkScratch& scratch) const;
  void WriteRow(Head& head, const ChunkRows& rows, int64_t offset, int64_t new_row,
                int64_t staged_row, const std::vector<MergeTerm>& terms, uint64_t count);
  void FinishHead(Head& head);
  void WriteProtectedRows(Head& head);
  void ShiftInPlace(Head& head);
  void WriteCount(Head& head, int64_t new_row, uint64_t count);
  void Finalize();
  void FinalizeHead(Head& head);
  template <typename Body>
  void ParallelOverHeads(bool (*want)(const Head&), Body body);

  const KernelTable& kernels_;
  ScratchPool* scratch_;
  HeadPool* head_pool_;
  const LayerPlan& plan_;
  const LayerView layer_;  // a copy: a view is a few pointers, and callers pass temporaries
  const CompressControl& control_;
  const StopCheck stop_;  // control_.IsCancelled(), for the match kernels
  CompressResult* out_;

  std::vector<Head> heads_;
  ElemType input_type_;
  int64_t input_element_bytes_;
  int64_t key_stride_, value_stride_;  // input elements between tokens of one head
  int32_t key_dim_, value_dim_;
  int32_t chunk_size_;
  int32_t slots_;  // sources per full chunk
  int64_t target_;
  double bound_;        // MatchErrorBound(kernels, key_dim, chunk_size)
  double floor_ = 0.0;  // this pass's similarity floor, -infinity when off
  bool with_assignment_;
  bool output_allocated_ = false;
  ElemType output_type_;  // of the result rows: the options' result_dtype
  // The input check (EngineCaps::checks_layer_data): set by CheckInputRows, the first
  // RunChunks then checks each chunk's rows before using them.
  bool check_chunks_ = false;
  // Set once the first pass's chunks are checked: their values are checked in the result
  // rows written (MergeChunk, WriteOutputRows) instead of before they are read.
  bool values_at_output_ = false;
  mutable std::atomic<bool> bad_input_{false};
  // fp16 / bf16 result rows: whether a rounded key / value became Inf (BlockWriter::fits).
  mutable std::atomic<bool> keys_overflow_{false}, values_overflow_{false};
  // fp8 result rows with a dynamic scale (for keys, values or both): written as float32 rows
  // first, each head's largest magnitude noted on the way, then narrowed (NarrowStagedRows).
  bool fp8_staged_ = false;
  std::unique_ptr<std::atomic<uint32_t>[]> row_max_bits_;  // [2H]: keys, values of each head
  ElemType WriterType() const;
  // What the thread's BlockWriters saw of a head's rows: an fp16 / bf16 rounding to Inf, or
  // (fp8_staged_) the largest magnitudes.
  void NoteWritten(int32_t head, const BlockWriter& keys, const BlockWriter& values) const;
  void NarrowStagedRows();
};

// Per-head state of finished jobs, for the next ones: a job's O(n) arrays per head (counts,
// edges, assignment maps) are then not allocated, faulted in and freed every job. A free list
// under a mutex rather than per-thread storage, because a thread waiting inside one job may
// run another job's task (jobs run as tasks of one arena). The float64 rows of multi-pass
// jobs are not kept (they are as large as the job's input).
class HeadPool {
 public:
  std::vector<LayerJob::Head> Take();
  void Give(std::vector<LayerJob::Head> heads);

 private:
  static constexpr size_t kMaxKept = 8;
  std::mutex mu_;
  std::vector<std::vector<LayerJob::Head>> free_;
};

}  // namespace centroidkv::cpu
