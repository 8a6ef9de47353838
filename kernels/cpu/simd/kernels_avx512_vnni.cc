// The AVX-512 kernel table for CPUs with AVX512-VNNI: the AVX-512 table with matching in
// 16-bit integers (KernelTable::match_int16). This translation unit alone is compiled with
// the AVX-512 flags plus -mavx512vnni (kernels/CMakeLists.txt); it runs only after
// simd_dispatch.cc has checked those features (__builtin_cpu_supports("avx512vnni")).
//
// Integer matching, the template of simd/match_int16_simd.h over
// Avx512Int16: vpdpwssd multiplies 32 int16 pairs, adds them pairwise and accumulates into
// 16 int32 lanes in one instruction (no separate add, as AVX2's vpmaddwd + vpaddd need), 32
// multiply-adds against a float FMA's 16 at the same issue rate. Tile: 8 sources x 3 panels
// of 16 (24 accumulators + 3 panels + 1 broadcast of the 32 zmm, the float kernel's 8 x 48
// shape). The scores, and so the error bound (soft_match.h), are the AVX2 level's. Chunks
// shorter than kAvx512Int16MinChunk (96) stay on the float kernel: on the Zen 4 of
// docs/results/cpu-bench.md int16 only ties with it at C = 64, and is 0.84x its time per job
// at C = 256 and 0.67x at C = 1024.
#include "kernels/cpu/simd/vec_avx512.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"
#include "kernels/cpu/simd/match_int16_simd.h"

namespace centroidkv::cpu {
namespace {

struct Avx512Int16 : Avx512 {
  // One widened row times `scale` (its inverse norm times kInt16Scale), rounded to nearest
  // even (cvtps2dq, MXCSR's rounding, as the AVX2 level) and saturated to int16 (vpmovsdw,
  // as AVX2's packssdw), into q[0 .. padded): zeros past dim.
  static void QuantizeRow(const float* row, float scale, int32_t dim, int32_t padded, int16_t* q) {
    const __m512 s = _mm512_set1_ps(scale);
    int32_t j = 0;
    for (; j + 16 <= dim; j += 16) {
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + j), s));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm512_cvtsepi32_epi16(v));
    }
    for (; j < padded; j += 16) {  // the rest of the row (masked), then zeros up to `padded`
      const __m512 x = _mm512_maskz_loadu_ps(FirstLanes(dim - j), row + j);
      const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(x, s));
      _mm256_mask_storeu_epi16(q + j, FirstLanes(padded - j), _mm512_cvtsepi32_epi16(v));
    }
  }

  // vbroadcastss: a load alone.
  static I BroadcastPair(const int16_t* p) {
    return _mm512_castps_si512(_mm512_set1_ps(*reinterpret_cast<const float*>(p)));
  }

  static I LoadPanel(const int16_t* p) { return _mm512_load_si512(p); }

  // vpdpwssd by inline asm rather than _mm512_dpwssd_epi32: with the intrinsic GCC 12 copies
  // every accumulator of the tile through another register and the stack on each step (its
  // builtin does not tie the accumulator to the destination register), which made the kernel
  // slower than the float one.
  __attribute__((always_inline)) static I MulAdd(I acc, I a, I b) {
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
  }
};

constexpr KernelTable MakeAvx512VnniTable() {
  KernelTable table = MakeKernelTable<Avx512>();
  table.match_int16 = MatchInt16<Avx512Int16>;
  table.int16_min_chunk = kAvx512Int16MinChunk;
  return table;
}

}  // namespace

namespace internal {

const KernelTable& Avx512VnniKernels() {
  static constexpr KernelTable kTable = MakeAvx512VnniTable();
  return kTable;
}

}  // namespace internal
}  // namespace centroidkv::cpu
