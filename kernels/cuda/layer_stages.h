// The CUDA backend's algorithm (SPEC.md section 2) as a fixed sequence of *stages*, each a
// function of one independent item (a row, a source, a head, a job) over plain arrays. The
// device runs each stage as one kernel launch over all items of a batch of layer jobs
// (layer_kernels.cu); the host runs the very same functions in plain loops
// (host_pipeline.h), so the whole algorithm is tested by the conformance suite on any
// machine, with or without a GPU. Only the per-head top-r sort differs (CUB on the device,
// std::stable_sort on the host), and both are stable sorts of the same keys.
//
// Exactness (same results as the reference engine, bit for bit):
// - The similarity search (the O(n * C * d) part) runs in float32 on rows normalised in
//   float64. A float score is within kBound(d) = (2 d + 16) 2^-24 of the reference's float64
//   cosine (float rounding of each normalised element, u = 2^-24 relative, and a dot product
//   chain, at most d u relative to sum |x^_j y^_j| <= 1). The float best destination of a
//   source is taken only when the float runner-up is more than 2 bound below it; otherwise
//   every destination within 2 bound of the float best is rescored exactly and the exact
//   best wins (lowest destination on ties).
// - The chosen edge of every source is then rescored with the reference's float64 cosine
//   (same operation order; __dmul_rn / __dadd_rn on the device so that nothing is fused), so
//   the floor test, the top-r order (score descending, then source ascending) and the order
//   of each destination's sums are the reference's own decisions.
// - Merges are float64 in the reference's operation order; rows between passes stay float64.
//
// Layout (all arrays head-major over the batch's G = jobs * heads "global heads" g; job j
// owns heads j * H .. j * H + H - 1): rows of head g at g * n + row; source slots of head g at
// g * slot_capacity + slot, where slot = chunk * ceil(C / 2) + offset / 2.
//
// Thread-safety: the item functions write only their own item's outputs, except the
// documented atomic counter (head_candidates); stages are separated by kernel boundaries.
#pragma once

#include <cstdint>
#include <cstring>

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

// The stages below, in the order a pass runs them (layer_batch.h: RunBatchStages).
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

// ---------------------------------------------------------------------------------------
// Scalar helpers (tested on the host in tests/kernels/cuda/layer_stages_test.cc).

// Correctly rounded float64 operations that the device compiler may not fuse.
CKV_HD double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
CKV_HD double AddRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CKV_HD double DivRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
CKV_HD double SqrtRn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

// The bits of one value as another type of the same size (memcpy: a register move on both
// host and device).
template <typename To, typename From>
CKV_HD To BitCast(From value) {
  static_assert(sizeof(To) == sizeof(From), "BitCast between types of one size");
  To out;
  memcpy(&out, &value, sizeof(out));
  return out;
}
CKV_HD float BitsToFloat(uint32_t bits) { return BitCast<float>(bits); }
CKV_HD uint32_t FloatToBits(float value) { return BitCast<uint32_t>(value); }

// float to bfloat16, rounded to nearest even (finite inputs; NaN stays NaN), as bits.
CKV_HD uint16_t FloatToBFloat16Bits(float value) {
  const uint32_t bits = FloatToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float to IEEE binary16, rounded to nearest even (overflow to infinity, NaN stays NaN), as
// bits: the same rounding as the host's FloatToHalf (common/dtype.h).
CKV_HD uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = FloatToBits(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16: infinity
  if (magnitude >= 0x38800000u) {  // normal in binary16 (>= 2^-14), or rounding up to infinity
    const uint32_t odd = (magnitude >> 13) & 1u;
    return sign | static_cast<uint16_t>((magnitude - 0x38000000u + 0xfffu + odd) >> 13);
  }
  // Subnormal or zero: adding 0.5 leaves the value in units of 2^-24, rounded to nearest even
  // by the float addition itself.
  const float aligned = BitsToFloat(magnitude) + 0.5f;
  return sign | static_cast<uint16_t>(FloatToBits(aligned) - 0x3f000000u);
}

CKV_HD uint64_t DoubleToBits(double value) { return BitCast<uint64_t>(value); }

// IEEE binary16 to float, exactly (subnormals, infinities and NaNs included).
CKV_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

CKV_HD float BFloat16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// Element `index` of a packed result array of `type`: the float rounded once (fp16 / bf16).
CKV_HD void StoreResult(void* rows, int32_t type, int64_t index, float value) {
  switch (type) {
    case kInputF16: static_cast<uint16_t*>(rows)[index] = FloatToHalfBits(value); return;
    case kInputBF16: static_cast<uint16_t*>(rows)[index] = FloatToBFloat16Bits(value); return;
    default: static_cast<float*>(rows)[index] = value; return;
  }
}

// A key whose unsigned order is the order of the (non-NaN) scores; 0 is below every score.
CKV_HD uint64_t OrderKey(double score) {
  if (score == 0.0) score = 0.0;  // -0 and +0 compare equal in the reference
  const uint64_t bits = DoubleToBits(score);
  return (bits >> 63) != 0 ? ~bits : (bits | (uint64_t{1} << 63));
}

// |float score - exact score| <= MatchBound(dim) (see the file comment).
CKV_HD double MatchBound(int32_t dim) {
  return (2.0 * dim + 16.0) * 5.9604644775390625e-8;  // 2^-24
}

// The bound for scores from tensor-core tiles (tile_match.h): bf16x3 products of rows
// normalised in float64 and rounded to float, accumulated in the tensor cores' float32:
//   2^-14 + (24 dim + 64) 2^-24.
// The derivation is kernels/cpu/soft_match.h's for the CPU's matrix engine (normalisation,
// the split hi + lo, the dropped lo lo' and tau terms: below 2^-14 + (dim / 16 + 12) u), with
// the accumulation allowed far more: tensor cores add products in groups, aligning them to
// the group's largest exponent and truncating (measured by Fasi et al., "Numerical behavior
// of NVIDIA tensor cores", 2021: a few units of 2^-23 per group), so each of the 3 dim
// products and accumulations is allowed 8 u = 2^-21 relative to the sum of the magnitudes
// (<= 1.01 by Cauchy-Schwarz): 24 dim u. A wider bound costs only more exact rescoring.
CKV_HD double TileMatchBound(int32_t dim) {
  return 6.103515625e-05 + (24.0 * dim + 64.0) * 5.9604644775390625e-8;  // 2^-14, 2^-24
}

// Source slots of a compressible range of `length` rows cut into chunks of `chunk`.
CKV_HD int32_t SlotsInRange(int64_t length, int32_t chunk) {
  if (length < 2) return 0;
  const int64_t half = (chunk + 1) / 2;
  const int64_t full = length / chunk, rest = length % chunk;
  return static_cast<int32_t>(full * half + (rest >= 2 ? (rest + 1) / 2 : 0));
}

// ---------------------------------------------------------------------------------------
// Row access.

// Element (row, j) of head g's current keys (values when `values`), widened exactly.
CKV_HD double LoadElement(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t row, int32_t j, bool values) {
  const int32_t dim = values ? p.value_dim : p.key_dim;
  if (cur != 0) {
    const double* state = values ? a.state_values[cur - 1] : a.state_keys[cur - 1];
    return state[(g * p.num_tokens + row) * dim + j];
  }
  const int64_t job = g / p.heads, h = g % p.heads;
  const int64_t local = p.token_major != 0 ? row * p.heads + h : h * p.num_tokens + row;
  const int64_t index = (job * p.heads * p.num_tokens + local) * dim + j;
  const void* data = values ? a.values_in : a.keys_in;
  switch (p.input_type) {
    case kInputF16:
      return static_cast<double>(HalfBitsToFloat(static_cast<const uint16_t*>(data)[index]));
    case kInputBF16:
      return static_cast<double>(BFloat16BitsToFloat(static_cast<const uint16_t*>(data)[index]));
    default:
      return static_cast<double>(static_cast<const float*>(data)[index]);
  }
}

CKV_HD uint64_t LoadCount(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t row) {
  if (cur != 0) return a.state_counts[cur - 1][g * p.num_tokens + row];
  const int64_t job = g / p.heads, h = g % p.heads;
  const int64_t local = p.token_major != 0 ? row * p.heads + h : h * p.num_tokens + row;
  return a.counts_in[job * p.heads * p.num_tokens + local];
}

CKV_HD int32_t NextBuffer(int32_t cur) { return cur == 1 ? 2 : 1; }

// The reference engine's cosine of rows ra and rb of head g, bit for bit.
CKV_HD double ExactCosine(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                          int64_t ra, int64_t rb) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (int32_t j = 0; j < p.key_dim; ++j) {
    const double x = LoadElement(p, a, g, cur, ra, j, false);
    const double y = LoadElement(p, a, g, cur, rb, j, false);
    dot = AddRn(dot, MulRn(x, y));
    norm_a = AddRn(norm_a, MulRn(x, x));
    norm_b = AddRn(norm_b, MulRn(y, y));
  }
  double sa = SqrtRn(norm_a), sb = SqrtRn(norm_b);
  sa = sa < 1e-6 ? 1e-6 : sa;
  sb = sb < 1e-6 ? 1e-6 : sb;
  return DivRn(dot, MulRn(sa, sb));
}

// Where row `row` of head g sits in this pass's chunking.
struct RowPlace {
  bool in_range = false;
  bool source = false;  // even offset
  int32_t slot = -1;    // its source slot when `source`
  int64_t first = 0;    // the chunk's first row
  int32_t length = 0;   // the chunk's rows
  int32_t first_slot = 0;
};

CKV_HD RowPlace PlaceRow(const BatchParams& p, const BatchArrays& a, int64_t g, int64_t row) {
  RowPlace place;
  const int64_t begin = p.sink, end = static_cast<int64_t>(a.head_length[g]) - p.recent;
  if (row < begin || row >= end) return place;
  const int64_t chunk = (row - begin) / p.chunk;
  const int32_t offset = static_cast<int32_t>((row - begin) % p.chunk);
  const int32_t half = (p.chunk + 1) / 2;
  place.in_range = true;
  place.source = offset % 2 == 0;
  place.first = begin + chunk * p.chunk;
  place.length = static_cast<int32_t>(end - place.first < p.chunk ? end - place.first : p.chunk);
  place.first_slot = static_cast<int32_t>(chunk * half);
  if (place.source) place.slot = place.first_slot + offset / 2;
  return place;
}

// Chunks of a head at its longest (pass 0): the item count per head of chunk stages.
CKV_HD int64_t ChunksPerHead(const BatchParams& p) {
  const int64_t range = static_cast<int64_t>(p.num_tokens) - p.sink - p.recent;
  return range <= 0 ? 0 : (range + p.chunk - 1) / p.chunk;
}

// The row of source slot `slot` of head g.
CKV_HD int64_t SlotRow(const BatchParams& p, int64_t slot) {
  const int32_t half = (p.chunk + 1) / 2;
  return p.sink + (slot / half) * p.chunk + 2 * (slot % half);
}

// The reference's order of kept edges: score descending, then source ascending.
CKV_HD bool Precedes(const BatchArrays& a, int64_t base, int32_t x, int32_t y) {
  const double sx = a.edge_score[base + x], sy = a.edge_score[base + y];
  if (sx != sy) return sx > sy;
  return x < y;
}

// Warp stages (IsWarpStage): on the device the 32 lanes of a warp run one item together,
// splitting the loops over a row's elements (coalesced loads) and combining float sums with
// shuffles; everything else they compute redundantly (identical values), and only the lead
// lane writes. On the host one "lane" runs the item, or (tests) 32 threads emulate a warp:
// each thread's HostLane says which lane it is and where the warp sums.
#if !defined(__CUDA_ARCH__)
class HostWarp {
 public:
  virtual ~HostWarp() = default;
  // The warp-wide sum as the device's butterfly computes it (lane 0's value), for every lane.
  virtual float Sum(int32_t lane, float v) = 0;
  virtual double Sum(int32_t lane, double v) = 0;
  // Waits for every lane of the warp (__syncwarp).
  virtual void Sync() = 0;
};
// The barrier of a block's threads (__syncthreads), for block stages run on host threads.
class HostBlockBarrier {
 public:
  virtual ~HostBlockBarrier() = default;
  virtual void Sync() = 0;
};
struct HostLane {
  int32_t index = 0;
  int32_t count = 1;
  HostWarp* warp = nullptr;
  HostBlockBarrier* block = nullptr;
};
inline HostLane& CurrentHostLane() {
  static thread_local HostLane lane;
  return lane;
}
#endif
CKV_HD constexpr bool IsWarpStage(StageId id) {
  return id == StageId::kNormalize || id == StageId::kMatch || id == StageId::kMerge ||
         id == StageId::kEmit;
}
CKV_HD int32_t LaneIndex() {
#if defined(__CUDA_ARCH__)
  return static_cast<int32_t>(threadIdx.x & 31u);
#else
  return CurrentHostLane().index;
#endif
}
CKV_HD int32_t LaneCount() {
#if defined(__CUDA_ARCH__)
  return 32;
#else
  return CurrentHostLane().count;
#endif
}
CKV_HD bool LeadLane() { return LaneIndex() == 0; }

// The sum of `v` over the warp's lanes, the same value in every lane (lane 0's broadcast).
template <typename T>
CKV_HD T LaneSum(T v) {
#if defined(__CUDA_ARCH__)
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return __shfl_sync(0xffffffffu, v, 0);
#else
  const HostLane& lane = CurrentHostLane();
  return lane.warp == nullptr ? v : lane.warp->Sum(lane.index, v);
#endif
}

// Atomic on the device and on the host (where a block stage may run on many threads).
CKV_HD void AtomicIncrement(int32_t* counter) {
#if defined(__CUDA_ARCH__)
  atomicAdd(counter, 1);
#else
  __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);  // GCC's builtin: C++17 for nvcc too
#endif
}

// ---------------------------------------------------------------------------------------
// The stages, in the order a pass runs them (see layer_batch.h: RunBatchStages).

// Items G * n: the identity assignment and the initial per-head / per-job state.
CKV_HD void StageInit(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, i = item % p.num_tokens;
  a.owner[item] = static_cast<int32_t>(i);
  if (i != 0) return;
  a.head_cur[g] = 0;
  a.head_length[g] = p.num_tokens;
  if (g % p.heads != 0) return;
  const int64_t job = g / p.heads;
  a.job_done[job] = 0;
  a.job_passes[job] = 0;
  a.job_output_written[job] = 0;
}

// Items G: step 1, which heads take part in this pass.
CKV_HD void StageSetup(const BatchParams& p, const BatchArrays& a, int64_t g) {
  const bool done = a.job_done[g / p.heads] != 0;
  const int32_t length = a.head_length[g];
  const bool active = !done && a.passthrough[g] == 0 && length > p.target;
  a.head_active[g] = active ? 1 : 0;
  a.head_slots[g] = active ? SlotsInRange(static_cast<int64_t>(length) - p.sink - p.recent,
                                          p.chunk)
                           : 0;
  a.head_candidates[g] = 0;
  a.head_merges[g] = 0;
}

// 1 / max(|key row|, 1e-6) in float64, the lanes of a warp splitting the sum (any order
// stays within MatchBound / TileMatchBound).
CKV_HD double InverseKeyNorm(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                             int64_t row) {
  double sum = 0.0;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    const double x = LoadElement(p, a, g, cur, row, j, false);
    sum += x * x;
  }
  sum = LaneSum(sum);
  double norm = SqrtRn(sum);
  norm = norm < 1e-6 ? 1e-6 : norm;
  return 1.0 / norm;
}

// Items G * n: each current row of an active head, normalised in float64, as float.
CKV_HD void StageNormalize(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (a.head_slots[g] == 0 || row >= a.head_length[g]) return;
  const int32_t cur = a.head_cur[g];
  const double inverse = InverseKeyNorm(p, a, g, cur, row);
  float* out = a.norm_keys + item * p.key_dim;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    out[j] = static_cast<float>(LoadElement(p, a, g, cur, row, j, false) * inverse);
  }
}

// The float score of two normalised rows (lanes split the elements; any summation order
// stays within MatchBound).
CKV_HD float FloatScore(const float* x, const float* y, int32_t dim) {
  float dot = 0.0f;
  for (int32_t j = LaneIndex(); j < dim; j += LaneCount()) dot += x[j] * y[j];
  return LaneSum(dot);
}

// Near ties a tile match lists per source (kMatchTiles); more than that is kTieOverflow,
// and ResolveSourceEdge then rescores every destination of the chunk exactly.
constexpr int32_t kMaxTies = 8;
constexpr int32_t kTieOverflow = -1;

// Source slot `item` of this pass (kMatch, ResolveSourceEdge).
struct SourceEdge {
  int64_t g = 0;        // its head
  int32_t cur = 0;      // the head's current rows
  int64_t source = 0;   // its row
  RowPlace place;       // its chunk
  int32_t destinations = 0;
};

// The start of steps 3-4 for source slot `item`: false when the slot is unused this pass, or
// when its chunk has no destination (its edge is then written: none). Otherwise resets its
// outputs and fills `edge`. Only `writer` (the lead lane of a warp stage; every thread of a
// thread stage) writes.
CKV_HD bool BeginSourceEdge(const BatchParams& p, const BatchArrays& a, int64_t item,
                            bool writer, SourceEdge* edge) {
  edge->g = item / p.slot_capacity;
  const int32_t slot = static_cast<int32_t>(item % p.slot_capacity);
  if (slot >= a.head_slots[edge->g]) return false;
  edge->cur = a.head_cur[edge->g];
  edge->source = SlotRow(p, slot);
  edge->place = PlaceRow(p, a, edge->g, edge->source);
  edge->destinations = edge->place.length / 2;
  if (writer) {
    a.edge_kept[item] = 0;
    a.sort_values_in[item] = slot;
    if (edge->destinations == 0) {
      a.edge_dest[item] = -1;
      a.edge_score[item] = 0.0;
      a.sort_keys_in[item] = 0;
    }
  }
  return edge->destinations > 0;
}

// The end of steps 3-4: the source's exact best edge (destination k of its chunk, exact
// score), whether it is a candidate, and its sort key.
CKV_HD void EndSourceEdge(const BatchArrays& a, const PassArgs& pass, int64_t g, int64_t item,
                          bool writer, const RowPlace& place, int32_t best, double exact) {
  const bool candidate = pass.floor_on == 0 || exact >= pass.floor;
  if (!writer) return;
  a.edge_dest[item] = static_cast<int32_t>(place.first + 2 * best + 1);
  a.edge_score[item] = exact;
  a.sort_keys_in[item] = candidate ? OrderKey(exact) : 0;
  if (candidate) AtomicIncrement(&a.head_candidates[g]);
}

// Items G * slot_capacity: steps 3-4 for one source, its exact best edge and whether it is
// a candidate, plus its sort key.
CKV_HD void StageMatch(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  SourceEdge edge;
  if (!BeginSourceEdge(p, a, item, LeadLane(), &edge)) return;
  const int64_t g = edge.g, source = edge.source;
  const int32_t cur = edge.cur, destinations = edge.destinations;
  const RowPlace& place = edge.place;
  const float* rows = a.norm_keys + g * p.num_tokens * p.key_dim;
  const float* x = rows + source * p.key_dim;
  float top = 0.0f, second = 0.0f;
  int32_t best = -1;
  for (int32_t k = 0; k < destinations; ++k) {
    const float score = FloatScore(x, rows + (place.first + 2 * k + 1) * p.key_dim, p.key_dim);
    if (best < 0 || score > top) {
      second = best < 0 ? score : top;
      top = score;
      best = k;
    } else if (k == 1 || score > second) {
      second = score;
    }
  }
  double exact = 0.0;
  const double margin = 2.0 * p.bound;
  if (destinations >= 2 && static_cast<double>(second) >= static_cast<double>(top) - margin) {
    // A near tie in float: rescore every destination that could be the exact best.
    best = -1;
    for (int32_t k = 0; k < destinations; ++k) {
      const float score =
          FloatScore(x, rows + (place.first + 2 * k + 1) * p.key_dim, p.key_dim);
      if (static_cast<double>(score) < static_cast<double>(top) - margin) continue;
      const double s = ExactCosine(p, a, g, cur, source, place.first + 2 * k + 1);
      if (best < 0 || s > exact) {
        best = k;
        exact = s;
      }
    }
  } else {
    exact = ExactCosine(p, a, g, cur, source, place.first + 2 * best + 1);
  }
  EndSourceEdge(a, pass, g, item, LeadLane(), place, best, exact);
}

// Steps 3-4 for source slot `item` after the tile match listed its near ties (every
// destination whose tensor-core score is within 2 TileMatchBound of its best, so the exact
// best among them): the exact best of the list (lowest destination on equal scores), or of
// every destination when the list overflowed; then its edge, candidacy and sort key. Run by
// the tile match's block right after it wrote the list (tile_match.h), one thread per source:
// the float64 cosine is a sequential sum (the reference's order), so lanes cannot share one,
// and the rows are still in L2.
CKV_HD void ResolveSourceEdge(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                              int64_t item) {
  SourceEdge edge;
  if (!BeginSourceEdge(p, a, item, true, &edge)) return;
  const int64_t g = edge.g, source = edge.source;
  const int32_t cur = edge.cur, destinations = edge.destinations;
  const RowPlace& place = edge.place;
  const int32_t listed = a.match_count[item];
  const int32_t* ties = a.match_ties + item * kMaxTies;
  const int32_t count = listed == kTieOverflow ? destinations : listed;
  int32_t best = -1;
  double exact = 0.0;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t k = listed == kTieOverflow ? i : ties[i];
    const double s = ExactCosine(p, a, g, cur, source, place.first + 2 * k + 1);
    if (best < 0 || s > exact || (s == exact && k < best)) {
      best = k;
      exact = s;
    }
  }
  EndSourceEdge(a, pass, g, item, true, place, best, exact);
}

// Items J: step 5 (r per head, uniform_heads), step 8 (stop), and the sort segments.
CKV_HD void StageSelect(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                        int64_t job) {
  const int64_t first = job * p.heads;
  for (int64_t g = first; g < first + p.heads; ++g) {
    a.seg_begin[g] = static_cast<int32_t>(g * p.slot_capacity);
    a.seg_end[g] = a.seg_begin[g];
  }
  if (a.job_done[job] != 0) return;
  bool any_long = false;
  int64_t smallest = -1;  // min over compressed heads of r_h
  for (int64_t g = first; g < first + p.heads; ++g) {
    int64_t r = 0;
    if (a.head_active[g] != 0) {
      any_long = true;
      r = static_cast<int64_t>(a.head_length[g]) - p.target;
      if (a.head_candidates[g] < r) r = a.head_candidates[g];
    }
    a.head_merges[g] = static_cast<int32_t>(r);
    if (a.passthrough[g] == 0 && (smallest < 0 || r < smallest)) smallest = r;
  }
  if (!any_long) {
    a.job_done[job] = 1;
    return;
  }
  bool merged = false;
  for (int64_t g = first; g < first + p.heads; ++g) {
    if (p.uniform != 0) a.head_merges[g] = a.passthrough[g] != 0 ? 0 : static_cast<int32_t>(smallest);
    if (a.head_merges[g] > 0) {
      merged = true;
      // A head that keeps every source needs no order to choose them (StageMarkKept): its
      // segment stays empty and the sort skips it.
      if (a.head_merges[g] < a.head_slots[g]) a.seg_end[g] = a.seg_begin[g] + a.head_slots[g];
    }
  }
  if (!merged) {
    for (int64_t g = first; g < first + p.heads; ++g) a.seg_end[g] = a.seg_begin[g];
    a.job_done[job] = 1;
    return;
  }
  a.job_passes[job] = pass.pass + 1;
  if (pass.sink_output != 0) a.job_output_written[job] = 1;
}

// Items G * slot_capacity: step 6, the first r_h slots of the head's sorted order are kept.
CKV_HD void StageMarkKept(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.slot_capacity, q = item % p.slot_capacity;
  if (q >= a.head_merges[g]) return;
  // Every source kept (StageSelect left the head unsorted): slot q itself.
  const bool all = a.head_merges[g] == a.head_slots[g];
  a.edge_kept[g * p.slot_capacity + (all ? static_cast<int32_t>(q) : a.sort_values_out[item])] = 1;
}

CKV_HD bool IsKeptSource(const BatchParams& p, const BatchArrays& a, int64_t g, int64_t row,
                         int32_t* slot) {
  const RowPlace place = PlaceRow(p, a, g, row);
  if (!place.source || place.slot >= a.head_slots[g]) return false;  // a lone last row
  *slot = place.slot;
  return a.edge_kept[g * p.slot_capacity + place.slot] != 0;
}

// Whether this pass rewrites head g's rows: a merging head, or every head of a job whose
// float output this (last) pass writes.
CKV_HD bool RewritesHead(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                         int64_t g) {
  if (a.job_done[g / p.heads] != 0) return false;
  return a.head_merges[g] > 0 || pass.sink_output != 0;
}

// The compaction of step 7 (each row's index after the pass) in three stages over blocks of
// kIndexBlockRows rows, so that a head's rows are not one thread's sequential loop: kept
// sources per block (kIndexCount), their exclusive prefix per head (kIndexPrefix), then each
// block's rows (kIndex).
constexpr int32_t kIndexBlockRows = 256;
CKV_HD int64_t IndexBlocks(const BatchParams& p) {
  return (p.num_tokens + kIndexBlockRows - 1) / kIndexBlockRows;
}

// Block `item` of the compaction: head g's current rows first .. end - 1; false when the pass
// does not rewrite the head.
struct IndexBlock {
  int64_t g = 0, first = 0, end = 0;
};
CKV_HD bool FindIndexBlock(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                           int64_t item, IndexBlock* block) {
  block->g = item / IndexBlocks(p);
  block->first = item % IndexBlocks(p) * kIndexBlockRows;
  const int64_t length = a.head_length[block->g];
  block->end = block->first + kIndexBlockRows < length ? block->first + kIndexBlockRows : length;
  return RewritesHead(p, a, pass, block->g);
}

// Items G * IndexBlocks: the kept sources among the block's current rows.
CKV_HD void StageIndexCount(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                            int64_t item) {
  IndexBlock block;
  if (!FindIndexBlock(p, a, pass, item, &block)) return;
  const int64_t g = block.g;
  int32_t kept = 0;
  for (int64_t row = block.first; row < block.end; ++row) {
    int32_t slot = -1;
    kept += IsKeptSource(p, a, g, row, &slot) ? 1 : 0;
  }
  a.index_blocks[item] = kept;
}

// Items G: each block's count becomes the kept sources of the head before it.
CKV_HD void StageIndexPrefix(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                             int64_t g) {
  if (!RewritesHead(p, a, pass, g)) return;
  int32_t* blocks = a.index_blocks + g * IndexBlocks(p);
  int32_t before = 0;
  for (int64_t b = 0; b < IndexBlocks(p); ++b) {
    const int32_t kept = blocks[b];
    blocks[b] = before;
    before += kept;
  }
}

// Items G * IndexBlocks: each row of the block, its index after the pass (-1: merged away).
CKV_HD void StageIndex(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  IndexBlock block;
  if (!FindIndexBlock(p, a, pass, item, &block)) return;
  const int64_t g = block.g;
  int32_t* index = a.new_index + g * p.num_tokens;
  int32_t kept = a.index_blocks[item];
  for (int64_t row = block.first; row < block.end; ++row) {
    int32_t slot = -1;
    if (IsKeptSource(p, a, g, row, &slot)) {
      index[row] = -1;
      ++kept;
    } else {
      index[row] = static_cast<int32_t>(row) - kept;
    }
  }
}

// Items G * ChunksPerHead: for each destination row of the chunk, its kept sources in the
// reference's order (score descending, then source ascending) as a list: the first in
// bucket_head[row], each one's next in bucket_next[slot]. One thread per chunk inserts the
// chunk's kept sources one by one into their destination's sorted list (lists are short:
// O(C) per chunk for spread-out edges, O(C^2) at worst when all go to one destination).
CKV_HD void StageBucket(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / ChunksPerHead(p), chunk = item % ChunksPerHead(p);
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  const int64_t first = p.sink + chunk * p.chunk;
  if (first >= static_cast<int64_t>(a.head_length[g]) - p.recent) return;  // past the range
  const RowPlace place = PlaceRow(p, a, g, first);
  int32_t* heads = a.bucket_head + g * p.num_tokens;
  for (int32_t offset = 1; offset < place.length; offset += 2) heads[first + offset] = -1;
  const int64_t base = g * p.slot_capacity;
  const int32_t end_slot = place.first_slot + (place.length + 1) / 2 < a.head_slots[g]
                               ? place.first_slot + (place.length + 1) / 2
                               : a.head_slots[g];
  for (int32_t s = place.first_slot; s < end_slot; ++s) {
    if (a.edge_kept[base + s] == 0) continue;
    int32_t* link = &heads[a.edge_dest[base + s]];
    while (*link >= 0 && Precedes(a, base, *link, s)) link = &a.bucket_next[base + *link];
    a.bucket_next[base + s] = *link;
    *link = s;
  }
}

// Items G * n: step 7, each surviving row written to its new place: merged with its kept
// sources (float64, the reference's order) or copied exactly. On the last pass straight into
// the packed float output (out_offsets computed ahead, see StageOffsets), else into the
// head's other float64 buffer.
CKV_HD void StageMerge(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                       int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (!RewritesHead(p, a, pass, g) || row >= a.head_length[g]) return;
  const int32_t new_row = a.new_index[item];
  if (new_row < 0) return;
  const int32_t cur = a.head_cur[g];
  const int64_t base = g * p.slot_capacity;
  int32_t first = -1;
  if (a.head_merges[g] > 0) {
    const RowPlace place = PlaceRow(p, a, g, row);
    if (place.in_range && !place.source) first = a.bucket_head[item];
  }
  const uint64_t own = LoadCount(p, a, g, cur, row);
  uint64_t total = own;
  for (int32_t s = first; s >= 0; s = a.bucket_next[base + s]) {
    total += LoadCount(p, a, g, cur, SlotRow(p, s));
  }
  const int64_t out_row = g * p.num_tokens + new_row;
  const int64_t packed_row = a.out_offsets[g] + new_row;  // the last pass writes packed rows
  const int32_t next = NextBuffer(cur);
  for (int32_t part = 0; part < 2; ++part) {
    const bool values = part == 1;
    const int32_t dim = values ? p.value_dim : p.key_dim;
    for (int32_t j = LaneIndex(); j < dim; j += LaneCount()) {
      double v = LoadElement(p, a, g, cur, row, j, values);
      if (first >= 0) {
        double sum = MulRn(static_cast<double>(own), v);
        for (int32_t s = first; s >= 0; s = a.bucket_next[base + s]) {
          const int64_t source = SlotRow(p, s);
          sum = AddRn(sum, MulRn(static_cast<double>(LoadCount(p, a, g, cur, source)),
                                 LoadElement(p, a, g, cur, source, j, values)));
        }
        v = DivRn(sum, static_cast<double>(total));
      }
      if (pass.sink_output != 0) {
        StoreResult(values ? a.packed_values : a.packed_keys, p.result_type, packed_row * dim + j,
                    static_cast<float>(v));
      } else {
        (values ? a.state_values : a.state_keys)[next - 1][out_row * dim + j] = v;
      }
    }
  }
  if (!LeadLane()) return;
  if (pass.sink_output != 0) {
    a.packed_counts[packed_row] = static_cast<uint32_t>(total);
  } else {
    a.state_counts[next - 1][out_row] = total;
  }
}

// Items G * n: the assignment follows each input entry to its new row.
CKV_HD void StageOwner(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens;
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  int64_t row = a.owner[item];
  int32_t slot = -1;
  if (IsKeptSource(p, a, g, row, &slot)) row = a.edge_dest[g * p.slot_capacity + slot];
  a.owner[item] = a.new_index[g * p.num_tokens + row];
}

// Items G: the head's new length and row buffer.
CKV_HD void StageFinish(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                        int64_t g) {
  if (a.job_done[g / p.heads] != 0 || a.head_merges[g] == 0) return;
  a.head_length[g] -= a.head_merges[g];
  if (pass.sink_output == 0) a.head_cur[g] = NextBuffer(a.head_cur[g]);
}

// One item: where each head's rows start once heads are concatenated. Run twice: in the last
// pass after kSelect (pass.sink_output), from the lengths that pass will leave (a head loses
// head_merges rows; heads of finished jobs keep theirs), so that kMerge writes packed rows
// directly; and at the end, from the final lengths (the same offsets), for kEmit.
CKV_HD void StageOffsets(const BatchParams& p, const BatchArrays& a, const PassArgs& pass) {
  int64_t total = 0;
  for (int64_t g = 0; g < p.global_heads(); ++g) {
    a.out_offsets[g] = total;
    total += a.head_length[g] - (pass.sink_output != 0 ? a.head_merges[g] : 0);
  }
  a.out_offsets[p.global_heads()] = total;
}

// Items G * n: the packed output rows of the jobs no last pass wrote (they stopped early, or
// had nothing to merge), from their current rows.
CKV_HD void StageEmit(const BatchParams& p, const BatchArrays& a, int64_t item) {
  const int64_t g = item / p.num_tokens, row = item % p.num_tokens;
  if (a.job_output_written[g / p.heads] != 0 || row >= a.head_length[g]) return;
  const int32_t cur = a.head_cur[g];
  const int64_t to = a.out_offsets[g] + row;
  for (int32_t j = LaneIndex(); j < p.key_dim; j += LaneCount()) {
    StoreResult(a.packed_keys, p.result_type, to * p.key_dim + j,
                static_cast<float>(LoadElement(p, a, g, cur, row, j, false)));
  }
  for (int32_t j = LaneIndex(); j < p.value_dim; j += LaneCount()) {
    StoreResult(a.packed_values, p.result_type, to * p.value_dim + j,
                static_cast<float>(LoadElement(p, a, g, cur, row, j, true)));
  }
  if (LeadLane()) a.packed_counts[to] = static_cast<uint32_t>(LoadCount(p, a, g, cur, row));
}

// Runs item `item` of stage `id` (a switch the device kernels resolve at compile time).
CKV_HD void RunStageItem(StageId id, const BatchParams& p, const BatchArrays& a,
                         const PassArgs& pass, int64_t item) {
  switch (id) {
    case StageId::kInit: StageInit(p, a, item); return;
    case StageId::kSetup: StageSetup(p, a, item); return;
    case StageId::kNormalize: StageNormalize(p, a, item); return;
    case StageId::kMatch: StageMatch(p, a, pass, item); return;
    case StageId::kSelect: StageSelect(p, a, pass, item); return;
    case StageId::kMarkKept: StageMarkKept(p, a, item); return;
    case StageId::kIndexCount: StageIndexCount(p, a, pass, item); return;
    case StageId::kIndexPrefix: StageIndexPrefix(p, a, pass, item); return;
    case StageId::kIndex: StageIndex(p, a, pass, item); return;
    case StageId::kBucket: StageBucket(p, a, item); return;
    case StageId::kMerge: StageMerge(p, a, pass, item); return;
    case StageId::kOwner: StageOwner(p, a, item); return;
    case StageId::kFinish: StageFinish(p, a, pass, item); return;
    case StageId::kEmit: StageEmit(p, a, item); return;
    case StageId::kOffsets: StageOffsets(p, a, pass); return;
    case StageId::kMatchTiles: return;  // a block stage: TileMatchBlock (tile_match.h)
  }
}

}  // namespace centroidkv::cuda
