// The AMX kernel table: the AVX-512 table with matching on the AMX matrix engine
// (KernelTable::match_bf16x3). This translation unit alone is compiled with the AVX-512
// flags plus -mavx512bf16 -mamx-tile -mamx-bf16 (kernels/CMakeLists.txt); it runs only after
// simd_dispatch.cc has checked those features and the kernel's permission to use the tile
// registers.
//
// Layout ("bf16x3"): each chunk row is normalised in float (x^ = x * inverse norm) and split
// into bf16 parts hi = RN(x^), lo = RN(x^ - hi), stored as [hi | lo], each part zero padded
// to P = RoundUp(dim, 32) elements. The score of a pair is three matrix products over the
// parts, hi.hi' + hi.lo' + lo.hi', accumulated in the same float32 tiles. Sources stay
// row-major (the A operand); destinations are re-laid into the VNNI blocks the B operand
// wants: per block of 16 destinations and per 32 elements of [hi | lo], 16 rows of 16
// element pairs. The product runs 32 sources x 32 destinations at a time in the four
// accumulator tiles; the 32 x b_count scores of a source block go to a cache-sized buffer
// and are folded into each source's top two right after, so the full score matrix is never
// stored.
#include "kernels/cpu/simd/amx_tiles.h"
#include "kernels/cpu/simd/vec_avx512.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"

namespace centroidkv::cpu {
namespace {

constexpr int32_t kTileRows = 16;   // rows of every tile
constexpr int32_t kTileDepth = 32;  // bf16 elements of K per tile row (64 bytes)
constexpr int32_t kBlock = 32;      // sources (and destinations) per step: two tiles

int32_t RoundUp(int32_t x, int32_t to) { return (x + to - 1) / to * to; }

// Tiles 0-3 accumulate float32 16 x 16, tiles 4-5 hold sources, 6-7 destinations.
void ConfigureTiles() { _tile_loadconfig(&kTileConfig); }

// bf16 bits of 16 floats, rounded to nearest even (denormals flush to zero).
__m256i ToBf16(__m512 x) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)); }

__m512 FromBf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// One row, scaled and split: out = [hi | lo], each part `part` elements (zero padded). 32
// elements per step (two float vectors to one bf16 vector), then masked steps of 16.
void SplitRow(const float* row, float inverse_norm, int32_t dim, int32_t part, uint16_t* out) {
  uint16_t* hi_out = out;
  uint16_t* lo_out = out + part;
  const __m512 scale = _mm512_set1_ps(inverse_norm);
  int32_t j = 0;
  for (; j + 32 <= dim; j += 32) {
    const __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(row + j), scale);
    const __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(row + j + 16), scale);
    const __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(x1, x0));  // [x0 | x1]
    const __m512 r0 = _mm512_sub_ps(x0, FromBf16(_mm512_castsi512_si256(hi)));  // exact
    const __m512 r1 = _mm512_sub_ps(x1, FromBf16(_mm512_extracti64x4_epi64(hi, 1)));
    _mm512_storeu_si512(hi_out + j, hi);
    _mm512_storeu_si512(lo_out + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(r1, r0)));
  }
  for (; j < part; j += 16) {  // the rest of the row, then zeros up to `part`
    const int32_t valid = dim - j;
    const __mmask16 lanes = valid >= 16  ? static_cast<__mmask16>(0xffff)
                            : valid <= 0 ? static_cast<__mmask16>(0)
                                         : static_cast<__mmask16>((1u << valid) - 1);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, row + j), scale);
    const __m256i hi = ToBf16(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi_out + j), hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo_out + j),
                        ToBf16(_mm512_sub_ps(x, FromBf16(hi))));
  }
}

// Rows count .. padded - 1 of split rows (stride 2 * part) set to zero.
void ZeroRows(int32_t count, int32_t padded, int32_t part, uint16_t* rows) {
  // A plain loop, not std::fill: no library template may be instantiated in this unit
  // (kernel_table.h says why).
  const int64_t stride = 2 * static_cast<int64_t>(part);
  for (int64_t k = count * stride; k < padded * stride; ++k) rows[k] = 0;
}

// Row-major split destinations (padded rows, a multiple of 16; `slices` = 2 * part / 32)
// into VNNI blocks: block (n, k) = 16 rows (element pairs 2t, 2t+1 of slice k) x 16
// destinations x 2, at vnni + (n * slices + k) * 512. A 16 x 16 transpose of 32-bit pairs
// per block.
void ToVnni(const uint16_t* rows, int32_t padded, int32_t slices, uint16_t* vnni) {
  const int64_t stride = static_cast<int64_t>(slices) * kTileDepth;
  for (int32_t n = 0; n < padded / kTileRows; ++n) {
    for (int32_t k = 0; k < slices; ++k) {
      __m512 r[16];
      for (int c = 0; c < 16; ++c) {
        r[c] = _mm512_loadu_ps(reinterpret_cast<const float*>(
            rows + (static_cast<int64_t>(n) * kTileRows + c) * stride + k * kTileDepth));
      }
      Avx512::Transpose(r);
      float* block = reinterpret_cast<float*>(
          vnni + (static_cast<int64_t>(n) * slices + k) * kTileRows * kTileDepth);
      for (int t = 0; t < 16; ++t) _mm512_storeu_ps(block + t * 16, r[t]);
    }
  }
}

// Scores of sources s0 .. s0 + 31 against every (padded) destination into scores[32][b_pad]:
// for each 32 x 32 block, the products hi.hi', hi.lo', lo.hi' over the parts' slices.
// Returns false, the scores unfinished, when `poller` says stop.
bool ScoreBlock(const uint16_t* a_rows, const uint16_t* vnni, int32_t b_pad, int32_t part,
                float* scores, LinePrefetcher* prefetcher, StopPoller* poller) {
  const int32_t part_slices = part / kTileDepth;
  const int32_t slices = 2 * part_slices;                    // per destination block
  const int64_t a_stride = 2 * static_cast<int64_t>(part) * 2;  // bytes
  const int64_t s_stride = static_cast<int64_t>(b_pad) * 4;     // bytes
  const uint16_t* a0 = a_rows;
  const uint16_t* a1 = a_rows + static_cast<int64_t>(kTileRows) * 2 * part;
  const int64_t block_work = int64_t{kBlock} * kBlock * 3 * part;
  for (int32_t d0 = 0; d0 < b_pad; d0 += kBlock) {
    if (poller->Stopped(block_work)) return false;
    const uint16_t* b0 = vnni + static_cast<int64_t>(d0 / kTileRows) * slices * 512;
    const uint16_t* b1 = b0 + static_cast<int64_t>(slices) * 512;
    const int64_t lo = part_slices * 512;  // the destinations' lo slices, after their hi ones
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    // Tiles 4-5: 32 sources' slice at `offset`; 6-7: 32 destinations' VNNI blocks at
    // `offset`; then the four 16 x 16 products into tiles 0-3.
    auto load_sources = [&](int64_t offset) {
      _tile_loadd(4, a0 + offset, a_stride);
      _tile_loadd(5, a1 + offset, a_stride);
    };
    auto load_destinations = [&](int64_t offset) {
      _tile_loadd(6, b0 + offset, 64);
      _tile_loadd(7, b1 + offset, 64);
    };
    // (With a share of the prefetches each time: small shares keep the line fill buffers
    // free for the tile loads.)
    auto multiply = [prefetcher] {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
      prefetcher->Step();
    };
    // Per slice k: hi.hi', then hi.lo' (the source tiles stay), then lo.hi': 10 tile loads
    // for 12 products.
    for (int32_t k = 0; k < part_slices; ++k) {
      load_sources(k * kTileDepth);
      load_destinations(k * 512);
      multiply();
      load_destinations(lo + k * 512);
      multiply();
      load_sources(part + k * kTileDepth);
      load_destinations(k * 512);
      multiply();
    }
    float* top = scores + d0;
    float* bottom = scores + static_cast<int64_t>(kTileRows) * b_pad + d0;
    _tile_stored(0, top, s_stride);
    _tile_stored(1, top + kTileRows, s_stride);
    _tile_stored(2, bottom, s_stride);
    _tile_stored(3, bottom + kTileRows, s_stride);
  }
  return true;
}

// The top two of one source's scores over b_count destinations (lowest index on ties), and
// its near ties for `tie_window`.
RowMatch TopTwo(const float* scores, int32_t b_count, double tie_window, NearTies* ties) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInfinity);
  __m512 m1 = neg_inf, m2 = m1;
  __m512i idx = Avx512::Iota();
  for (int32_t col = 0; col < b_count; col += 16) {
    __m512 s = _mm512_loadu_ps(scores + col);
    if (col + 16 > b_count) s = Avx512::Select(Avx512::FirstLanes(b_count - col), neg_inf, s);
    const __mmask16 greater = _mm512_cmp_ps_mask(s, m1, _CMP_GT_OQ);
    m2 = _mm512_max_ps(m2, _mm512_min_ps(m1, s));
    m1 = _mm512_max_ps(m1, s);
    idx = _mm512_mask_blend_epi32(greater, idx, Avx512::AddI(Avx512::Iota(), col));
  }
  const RowMatch match = Avx512::ReduceTop2(m1, m2, idx);
  ties->count = 0;
  const float threshold = NearTieThreshold(match.first, tie_window);
  if (match.second < threshold) return match;
  const __m512 floor = _mm512_set1_ps(threshold);
  int32_t count = 0;
  for (int32_t col = 0; col < b_count; col += 16) {
    __mmask16 near = _mm512_cmp_ps_mask(_mm512_loadu_ps(scores + col), floor, _CMP_GE_OQ);
    if (col + 16 > b_count) near &= Avx512::FirstLanes(b_count - col);
    const int32_t found = __builtin_popcount(near);
    if (found == 0) continue;
    if (count + found > NearTies::kMax) {
      ties->count = NearTies::kMax + 1;
      return match;
    }
    _mm512_mask_compressstoreu_epi32(ties->destinations + count, near,
                                     Avx512::AddI(Avx512::Iota(), col));
    count += found;
  }
  ties->count = count;
  return match;
}

// Rows are widened kGroup at a time into `group` (L1-sized: the widened chunk is never
// stored whole) and split from there, sources into a_split, destinations row-major past them.
constexpr int32_t kGroup = 32;  // even: a row's parity is its row number's

void MatchBf16x3(const RowBlock* rows, int64_t first, int32_t length, int32_t dim, float* group,
                 float* group_norms, uint16_t* a_split, uint16_t* b_split, float* scores,
                 const PrefetchRanges* prefetch, const StopCheck* stop, double tie_window,
                 RowMatch* out, NearTies* ties) {
  const int32_t sources = (length + 1) / 2, destinations = length / 2;
  const int32_t a_pad = RoundUp(sources, kBlock), b_pad = RoundUp(destinations, kBlock);
  const int32_t part = RoundUp(dim, kTileDepth);
  const int64_t stride = 2 * static_cast<int64_t>(part);
  uint16_t* b_rows = a_split + a_pad * stride;
  for (int32_t g = 0; g < length; g += kGroup) {
    const int32_t count = length - g < kGroup ? length - g : kGroup;
    // Rows whose float sum of squares overflows come back normalised, with inverse norm 1.
    WidenRows<Avx512>(rows, first + g, count, dim, group, group_norms);
    for (int32_t i = 0; i < count; ++i) {
      const int32_t r = g + i;
      uint16_t* split = (r % 2 == 0 ? a_split : b_rows) + (r / 2) * stride;
      SplitRow(group + static_cast<int64_t>(i) * dim, group_norms[i], dim, part, split);
    }
  }
  ZeroRows(sources, a_pad, part, a_split);
  ZeroRows(destinations, b_pad, part, b_rows);
  ToVnni(b_rows, b_pad, 2 * part / kTileDepth, b_split);

  ConfigureTiles();
  LinePrefetcher prefetcher(prefetch, static_cast<int64_t>(a_pad / kBlock) * (b_pad / kBlock) *
                                          3 * part / kTileDepth);
  StopPoller poller(stop);
  for (int32_t s0 = 0; s0 < sources; s0 += kBlock) {
    if (!ScoreBlock(a_split + static_cast<int64_t>(s0) * 2 * part, b_split, b_pad, part, scores,
                    &prefetcher, &poller)) {
      break;  // the tiles are released below
    }
    for (int32_t i = 0; i < kBlock && s0 + i < sources; ++i) {
      out[s0 + i] =
          TopTwo(scores + static_cast<int64_t>(i) * b_pad, destinations, tie_window, ties + s0 + i);
    }
  }
  _tile_release();
}

constexpr KernelTable MakeAmxTable() {
  KernelTable table = MakeKernelTable<Avx512>();
  table.name = "amx";
  table.match_bf16x3 = MatchBf16x3;
  return table;
}

}  // namespace

namespace internal {

const KernelTable& AmxKernels() {
  static constexpr KernelTable kTable = MakeAmxTable();
  return kTable;
}

}  // namespace internal
}  // namespace centroidkv::cpu
