// The AVX2 kernel table, with matching in 16-bit integers (KernelTable::match_int16). This
// translation unit alone is compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt); it
// runs only after simd_dispatch.cc has checked those features.
//
// Integer matching, the template of simd/match_int16_simd.h over Avx2Int16:
// vpmaddwd multiplies 16 int16 pairs and adds them pairwise into 8 int32 lanes, 16
// multiply-adds per instruction against a float FMA's 8, at the same issue rate (a vpaddd
// then adds them to the accumulator). Tile: 6 sources x 2 panels of 8 (12 accumulators + 2
// panels + broadcast + product: the 16 ymm).
#include "kernels/cpu/simd/vec_avx2.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"
#include "kernels/cpu/simd/match_int16_simd.h"

namespace centroidkv::cpu {
namespace {

struct Avx2Int16 : Avx2 {
  // One widened row times `scale` (its inverse norm times kInt16Scale), rounded to nearest
  // even and saturated to int16, into q[0 .. padded): zeros past dim.
  static void QuantizeRow(const float* row, float scale, int32_t dim, int32_t padded, int16_t* q) {
    const __m256 s = _mm256_set1_ps(scale);
    int32_t j = 0;
    for (; j + 16 <= dim; j += 16) {
      const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j), s));
      const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + j + 8), s));
      // packs works per 128-bit half: [lo0 hi0 lo1 hi1] back into element order.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), packed);
    }
    for (; j < dim; ++j) {
      // cvtss2si: the same rounding (MXCSR's, nearest even) as cvtps2dq above.
      const int32_t v = _mm_cvtss_si32(_mm_set_ss(row[j] * scale));
      q[j] = static_cast<int16_t>(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
    }
    for (; j < padded; ++j) q[j] = 0;
  }

  // vbroadcastss rather than vpbroadcastd: on AMD Zen it is a load alone, while vpbroadcastd
  // also takes a vector ALU slot that the multiply-adds need.
  static I BroadcastPair(const int16_t* p) {
    return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(p)));
  }

  static I LoadPanel(const int16_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  }

  static I MulAdd(I acc, I a, I b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
};

constexpr KernelTable MakeAvx2Table() {
  KernelTable table = MakeKernelTable<Avx2>();
  table.match_int16 = MatchInt16<Avx2Int16>;
  table.int16_min_chunk = kAvx2Int16MinChunk;
  return table;
}

}  // namespace

namespace internal {

const KernelTable& Avx2Kernels() {
  static constexpr KernelTable kTable = MakeAvx2Table();
  return kTable;
}

}  // namespace internal
}  // namespace centroidkv::cpu
