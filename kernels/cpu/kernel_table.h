// The instruction-set specific kernels of the CPU backend as one table of plain function
// pointers. There is one table per SIMD level (portable scalar, AVX2 + FMA + F16C, AVX-512);
// simd_dispatch.h picks the best one the CPU supports at run time, so the same binary runs on
// any x86-64. Thread-safe: the kernels are pure functions of their arguments.
//
// This header is included by the translation units compiled with -mavx2 / -mavx512f, so it
// holds only plain aggregates and declarations: no inline functions, member functions or
// library templates, whose out-of-line copies the linker could take from such a unit and run
// on a CPU without those instructions.
#pragma once

#include <cstdint>

namespace centroidkv::cpu {

// Element type of a row source: the wire dtypes (the two fp8 formats as codes with a
// scale), and float64 for the rows of a head that earlier passes merged (kept in double
// between passes, like the reference engine).
enum class ElemType : uint8_t { kF32, kF16, kBF16, kF64, kE4M3, kE5M2 };

constexpr bool IsFp8Elem(ElemType type) {
  return type == ElemType::kE4M3 || type == ElemType::kE5M2;
}

// Bytes of one element of `type`.
constexpr int64_t ElemTypeBytes(ElemType type) {
  return type == ElemType::kF64   ? 8
         : type == ElemType::kF32 ? 4
         : IsFp8Elem(type)        ? 1
                                  : 2;
}

// A set of rows of equal length in host memory: element j of row r is element
// r * stride + j of `data`, of type `type`. Borrowed. An fp8 element stands for its value
// times `scale`, widened as one float multiply (docs/fp8.md), so every kernel reads fp8 rows
// as the float32 rows the reference engine is given.
struct RowBlock {
  const void* data;
  ElemType type;
  int64_t stride;       // elements from one row to the next (>= the row length)
  float scale = 1.0f;   // fp8 only
};

// The result of matching one source row against the destination rows of its chunk: the
// destination with the highest float32 cosine and the two highest float32 scores
// (`second` is -infinity when there is one destination). Within MatchErrorBound(dim) of the
// exact scores, see soft_match.h.
struct RowMatch {
  int32_t best;  // destination index in [0, b_count), lowest on float ties
  float first;
  float second;
};

// Memory that a kernel brings into the L2 cache while it computes (the next chunk's rows),
// spread over its work so that the reads overlap the arithmetic instead of stalling the next
// chunk: up to two byte ranges; a null range is skipped.
struct PrefetchRanges {
  const char* data[2];
  int64_t bytes[2];
};

// Cooperative cancellation inside the match kernels, whose work on one chunk grows with its
// length squared: a kernel given a StopCheck asks stopped(context) between blocks of work,
// about every StopPoller::kWork multiply-adds, and returns early once it says true; its
// outputs are then unspecified and the caller drops them. stopped() may be called from
// several threads at once.
struct StopCheck {
  bool (*stopped)(const void* context);
  const void* context;
};

// Counts a kernel's work and asks its StopCheck (null: never stops) once per kWork.
class StopPoller {
 public:
  // ~1 ms of one core's float multiply-adds at the scalar level, ~0.1 ms with AVX-512.
  static constexpr int64_t kWork = int64_t{1} << 24;

  explicit StopPoller(const StopCheck* check) : check_(check) {}

  // Counts `work` multiply-adds about to be done; true once the check has said stop.
  bool Stopped(int64_t work) {
    if (check_ == nullptr) return false;
    left_ -= work;
    if (left_ > 0) return false;
    left_ = kWork;
    stopped_ = stopped_ || check_->stopped(check_->context);
    return stopped_;
  }

 private:
  const StopCheck* check_;
  int64_t left_ = 0;  // the first call asks
  bool stopped_ = false;
};

// The near ties of one source on a matrix engine (KernelTable::match_bf16x3): when its second
// score is within the tie window of its best, every destination scoring within the window
// of the best, in increasing order; count 0 when there is no near tie, and kMax + 1 when
// more than kMax destinations qualify (the list is then not kept).
struct NearTies {
  static constexpr int32_t kMax = 8;
  int32_t count;
  int32_t destinations[kMax];
};

// One term of a count-weighted merge: row `row` of a RowBlock weighted by `count`.
struct MergeTerm {
  int64_t row;
  double count;
};

struct KernelTable {
  const char* name;     // "scalar", "avx2", "avx512"
  int32_t panel_width;  // W: destination rows per packed panel
  int32_t row_block;    // A rows matched together (see match_rows)

  // Rows first .. first + count - 1 of `rows` widened to float into out[i * dim + j], and
  // each row's inverse norm 1 / max(|x|, 1e-6) (as cosine similarity scales it) into
  // inverse_norms[i]. Returns false when a row's float sum of squares overflowed (|x| above
  // ~1e19): such a row is written already normalised (in double) with inverse norm 1, so
  // `out` then no longer holds the rows' exact values.
  bool (*widen_rows)(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out,
                     float* inverse_norms);

  // Transposes `count` rows (float, dim each, row i at rows + i * row_stride), each scaled
  // by inverse_norms[i * norm_stride], into ceil(count / W) panels:
  // panels[(p * dim + j) * W + l] = row (p * W + l) element j, scaled; zero past `count`.
  void (*pack_panels)(const float* rows, int64_t row_stride, const float* inverse_norms,
                      int64_t norm_stride, int32_t count, int32_t dim, float* panels);

  // For each of the a_count rows of `a` (row i at a + i * a_stride, readable for
  // RoundUp(a_count, row_block) rows; rows past a_count are ignored): its dot products with
  // the b_count packed destinations, scaled by a_inverse_norms[i * norm_stride], and their
  // top two, fused (the a_count x b_count score matrix is never stored). `prefetch` (may be
  // null) is brought into L2 along the way; `stop` (may be null) as StopCheck says.
  void (*match_rows)(const float* a, int64_t a_stride, const float* a_inverse_norms,
                     int64_t norm_stride, int32_t a_count, const float* panels, int32_t b_count,
                     int32_t dim, const PrefetchRanges* prefetch, const StopCheck* stop,
                     RowMatch* out);

  // The b_count scores of one row `a` (scaled by a_inverse_norm) against the packed
  // destinations, computed with the same arithmetic as match_rows.
  void (*score_row)(const float* a, float a_inverse_norm, const float* panels, int32_t b_count,
                    int32_t dim, float* scores);

  // out[j] = (sum_k terms[k].count * row_k[j]) / total for j < dim, in float64 with the
  // reference engine's operation order (a product, then a sum, term by term, then one
  // correctly rounded division), rounded once to the output type.
  void (*merge_row_f32)(const RowBlock* rows, const MergeTerm* terms, int32_t num_terms,
                        double total, int32_t dim, float* out);
  void (*merge_row_f64)(const RowBlock* rows, const MergeTerm* terms, int32_t num_terms,
                        double total, int32_t dim, double* out);

  // Row `row` of `rows` converted to float / double (widening is exact).
  void (*convert_row_f32)(const RowBlock* rows, int64_t row, int32_t dim, float* out);
  void (*convert_row_f64)(const RowBlock* rows, int64_t row, int32_t dim, double* out);

  // Rows first .. first + count - 1 converted to float into out[i * dim + j].
  void (*convert_rows_f32)(const RowBlock* rows, int64_t first, int32_t count, int32_t dim,
                           float* out);

  // Whether rows first .. first + count - 1 (dim elements each) hold no Inf or NaN.
  bool (*rows_finite)(const RowBlock* rows, int64_t first, int32_t count, int32_t dim);

  // Copies `count` floats to `out`, which will not be read again soon: non-temporal stores
  // where `out` is aligned (no read-for-ownership of the destination), plain stores for the
  // unaligned ends. No fence: the caller fences (sfence) before others read `out`.
  // Returns whether every float copied is finite (no Inf or NaN).
  bool (*stream_floats)(const float* in, int64_t count, float* out);

  // stream_floats for fp16 / bf16 rows (`type` kF16 or kBF16): each of the `count` floats
  // rounded once to nearest even, bit for bit as FloatToHalf / FloatToBFloat16
  // (common/dtype.h) round it, into `out`; non-temporal stores where `out` is aligned, no
  // fence. Returns kStreamedNonFinite where a float read is Inf or NaN, and
  // kStreamedBeyondRange where a float's magnitude is at least HalfOverflowBits(type) (it
  // rounded to Inf: a finite value beyond the type's range, or a non-finite one), so that
  // the result's fit in its dtype is known without reading the rows again.
  // bf16 is integer rounding at every level: AVX512-BF16's VCVTNEPS2BF16 flushes subnormal
  // inputs to zero, which FloatToBFloat16 does not.
  uint32_t (*stream_halves)(const float* in, int64_t count, ElemType type, uint16_t* out);

  // Matching on a matrix engine (AMX), null where the level has none; ChunkMatcher then uses
  // widen_rows + pack_panels + match_rows instead. One chunk: rows first .. first + length - 1
  // of `rows` (dim elements each), sources the even rows, destinations the odd rows. Rows
  // are widened (as widen_rows does) kGroup = 32 at a time into `group` (at least 32 * dim
  // floats; `group_norms` at least 32), normalised in float and split into two bfloat16
  // parts, x = hi + lo + (below 2^-16 |x|); the score is hi.hi' + hi.lo' + lo.hi'
  // accumulated in float32 (three bf16 products per element, the "bf16x3" scheme): within
  // MatchErrorBound(kernels, dim) of the exact cosine (soft_match.h).
  // out[i] as match_rows gives it (scores already normalised), and ties[i] for the window
  // `tie_window` (a destination qualifies when its score >= best - tie_window, in double).
  // Scratch, each at least RoundUp(length, 64) * 2 * RoundUp(dim, 32) elements and 64-byte
  // aligned: a_split, b_split; `scores` at least 32 * RoundUp(length, 64) floats, aligned.
  // `prefetch` (may be null) is brought into L2 meanwhile; `stop` (may be null) as StopCheck
  // says.
  void (*match_bf16x3)(const RowBlock* rows, int64_t first, int32_t length, int32_t dim,
                       float* group, float* group_norms, uint16_t* a_split, uint16_t* b_split,
                       float* scores, const PrefetchRanges* prefetch, const StopCheck* stop,
                       double tie_window, RowMatch* out, NearTies* ties);

  // Matching in 16-bit integers (AVX2 vpmaddwd, AVX-512 VNNI vpdpwssd: twice the
  // multiply-adds per instruction of float FMAs), null where the level has none; ChunkMatcher
  // then uses match_rows, as it does for chunks shorter than int16_min_chunk. One chunk
  // already widened by widen_rows: row i of the chunk at tile + i * dim, its inverse norm at
  // inverse_norms[i]; sources the even rows, destinations the odd rows. Each row is scaled
  // to unit length and rounded to integers, q_j = RoundToInt(RN(x_j * RN(s_x * kInt16Scale)))
  // (nearest even, saturated to int16), rows padded with zeros to an even length; the score
  // of a pair is the exact int32 dot product of their q times RN(1 / kInt16Scale^2), in
  // float: within MatchErrorBound(kernels, dim) of the exact cosine (soft_match.h).
  // out[i] as match_rows gives it (scores already normalised), and ties[i] for the window
  // `tie_window` (as match_bf16x3). Scratch, 64-byte aligned, at least
  // (RoundUp(sources, row_block) + RoundUp(destinations, 16)) * RoundUp(dim, 2) elements for
  // a_quant and RoundUp(destinations, 16) * RoundUp(dim, 2) for b_panels (panels of 8
  // destinations on AVX2, 16 on AVX-512). `prefetch` (may be null) is brought into L2
  // meanwhile; `stop` (may be null) as StopCheck says.
  void (*match_int16)(const float* tile, const float* inverse_norms, int32_t length, int32_t dim,
                      int16_t* a_quant, int16_t* b_panels, const PrefetchRanges* prefetch,
                      const StopCheck* stop, double tie_window, RowMatch* out, NearTies* ties);

  // The shortest chunk (rows) that match_int16 runs: shorter ones do not pay for rounding
  // and packing their rows (the per-level values below, measured).
  int32_t int16_min_chunk;

  // The fit of fitted jobs (kernels/fit/): x[i] += bias[i], returning the largest; and
  // x[i] = e^(x[i] - shift), returning their sum (Cephes' expf, within 2 ulp; arguments
  // clamped to [-87.3, 88.7], so e^-inf gives about 1e-38, not 0).
  float (*fit_add_max)(float* x, const float* bias, int64_t count);
  float (*fit_exp_sub_sum)(float* x, float shift, int64_t count);
};

// KernelTable::stream_halves' flags.
constexpr uint32_t kStreamedNonFinite = 1;
constexpr uint32_t kStreamedBeyondRange = 2;

// The bits of the smallest float magnitude that rounds to Inf (nearest even) in fp16
// (65520.0f: halfway between 65504, whose last mantissa bit is odd, and 65536) or bf16
// (0x7f7f8000: halfway between 0x7f7f and Inf); with the sign cleared, a float's bits order
// as its magnitude, so x rounds to Inf exactly when (bits(x) & 0x7fffffff) >= this.
constexpr uint32_t HalfOverflowBits(ElemType type) {
  return type == ElemType::kF16 ? 0x477ff000u : 0x7f7f8000u;
}

// KernelTable::int16_min_chunk per level (docs/results/cpu-bench.md). AVX2: on an AMD EPYC
// Zen 4 (AVX2 level forced) the int16 kernel was 1.1-1.2x the float one at C = 64 and
// 1.3-1.5x at C = 256 and 1024, so every chunk takes it. AVX-512 VNNI, on the same Zen 4 (one
// pinned thread, whole pipeline, CPU time, alternating runs): a tie with the float AVX-512
// kernel at C = 64 (45.7 vs 44.6 ms per job, medians of 8; within the run-to-run spread),
// faster from C = 96 (48.5 vs 54.6), 128 (50.9 vs 57.8), 192, 256 (0.84x) and 1024 (0.67x).
// Not measured on Intel (two full 512-bit FMA pipes there): see docs/results/cpu-bench.md.
constexpr int32_t kAvx2Int16MinChunk = 2;
constexpr int32_t kAvx512Int16MinChunk = 96;

// The integer scale of KernelTable::match_int16: a unit-length row's elements are at most
// 1 in magnitude, so they round into int16 without saturating, and the dot product of two
// rows (at most ~kInt16Scale^2 (1 + dim 2^-15) in magnitude) fits in int32.
constexpr float kInt16Scale = 32767.0f;

namespace internal {
// The tables, one per SIMD level (two for AVX-512: with and without VNNI), defined in
// kernels_scalar.cc, simd/kernels_avx2.cc, simd/kernels_avx512.cc,
// simd/kernels_avx512_vnni.cc and simd/kernels_amx.cc. Use KernelsFor() (simd_dispatch.h),
// which checks the CPU first.
const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();
const KernelTable& Avx512VnniKernels();  // simd/kernels_avx512_vnni.cc: + match_int16
const KernelTable& AmxKernels();
}  // namespace internal

}  // namespace centroidkv::cpu
