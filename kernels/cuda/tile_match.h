// The tensor-core match (stage kMatchTiles): one block per (head, chunk, tile of up to 64
// sources) normalises its source rows and, 64 at a time, the chunk's destination rows into
// shared memory, split into bfloat16 hi + lo parts, multiplies them on the tensor cores in
// bf16x3 (hi hi' + hi lo' + lo hi', float32 accumulators, WMMA 16x16x16) and folds each
// 16 x 64 score tile into each source's near-tie list: every destination whose score is
// within 2 TileMatchBound(dim) of the source's best score. The scores never reach device
// memory. Then a thread of the same block finds each source's exact best among its list in
// float64 (ResolveSourceEdge, stage_match.h), while the rows are still in L2.
//
// One function, TileMatchBlock, is the block's whole algorithm for the device (tile_match.cu
// runs it with 4 warps of 32 lanes) and for the host (host_pipeline.cc runs it with one
// "warp" of one "lane", the tile product in plain float loops, so the conformance suite
// checks it on every machine; or, in tests, on 4 x 32 threads as the device's warps and
// lanes). Loops stride by warp and lane; BlockSync / WarpSync are the barriers (no-ops for a
// single host thread).
//
// Shared memory (TileLayout): source and destination rows as bf16 hi / lo with a pitch of
// the dimension rounded up to 16 plus 8 elements (rows 16-byte apart from a multiple of 128:
// WMMA's alignment, fewer bank conflicts), a 16 x 68 float score tile per warp, and per
// source its best score and near-tie list.
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_lanes.h"
#include "kernels/cuda/stage_layout.h"
#include "kernels/cuda/stage_match.h"
#include "kernels/cuda/stage_scalars.h"
#include "kernels/cuda/stage_types.h"

#if defined(__CUDA_ARCH__)
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace centroidkv::cuda {

constexpr int32_t kTileRows = 64;        // sources per block; destinations per tile
constexpr int32_t kTileWarps = 4;        // warps per block on the device (16 sources each)
constexpr int32_t kTileMaxDim = 256;     // key_dim the tile layout fits (else warp match)
constexpr int32_t kScorePitch = 68;      // floats per score row (64 + 4 against conflicts)

CKV_HD bool TileMatchSupports(int32_t key_dim) { return key_dim >= 1 && key_dim <= kTileMaxDim; }

// The key dimension rounded up to the tensor cores' k = 16 (zeros beyond key_dim).
CKV_HD int32_t TileDepth(int32_t key_dim) { return (key_dim + 15) / 16 * 16; }

// Byte offsets of the block's shared memory.
struct TileLayout {
  int32_t pitch = 0;  // bf16 elements per row
  int32_t source_hi = 0, source_lo = 0, dest_hi = 0, dest_lo = 0;
  int32_t scores = 0;     // [kTileWarps][16][kScorePitch] float
  int32_t top = 0;        // [kTileRows] float: best score so far
  int32_t tie_count = 0;  // [kTileRows] int32 (kTieOverflow: too many)
  int32_t tie_dest = 0;   // [kTileRows][kMaxTies] int32: destination k
  int32_t tie_score = 0;  // [kTileRows][kMaxTies] float
  int32_t bytes = 0;
};

CKV_HD TileLayout MakeTileLayout(int32_t key_dim) {
  TileLayout l;
  l.pitch = TileDepth(key_dim) + 8;
  const int32_t rows_bytes = kTileRows * l.pitch * 2;  // a multiple of 128 (pitch % 8 == 0)
  l.source_hi = 0;
  l.source_lo = l.source_hi + rows_bytes;
  l.dest_hi = l.source_lo + rows_bytes;
  l.dest_lo = l.dest_hi + rows_bytes;
  l.scores = l.dest_lo + rows_bytes;
  l.top = l.scores + kTileWarps * 16 * kScorePitch * 4;
  l.tie_count = l.top + kTileRows * 4;
  l.tie_dest = l.tie_count + kTileRows * 4;
  l.tie_score = l.tie_dest + kTileRows * kMaxTies * 4;
  l.bytes = l.tie_score + kTileRows * kMaxTies * 4;
  return l;
}

// Source tiles per chunk.
CKV_HD int32_t TilesPerChunk(const BatchParams& p) {
  return ((p.chunk + 1) / 2 + kTileRows - 1) / kTileRows;
}
// Blocks of one kMatchTiles launch: (head, chunk, source tile).
CKV_HD int64_t TileMatchItems(const BatchParams& p) {
  return p.global_heads() * ChunksPerHead(p) * TilesPerChunk(p);
}

CKV_HD void BlockSync() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#else
  if (CurrentHostLane().block != nullptr) CurrentHostLane().block->Sync();
#endif
}
CKV_HD void WarpSync() {
#if defined(__CUDA_ARCH__)
  __syncwarp();
#else
  if (CurrentHostLane().warp != nullptr) CurrentHostLane().warp->Sync();
#endif
}

// Row `row` of head g (current rows `cur`) normalised in float64, rounded to float and split
// into bf16 hi = RN(x^) and lo = RN(x^ - hi), TileDepth(key_dim) elements (zeros beyond
// key_dim); row < 0 writes zeros. The warp's lanes split the elements.
CKV_HD void LoadSplitRow(const BatchParams& p, const BatchArrays& a, int64_t g, int32_t cur,
                         int64_t row, uint16_t* hi, uint16_t* lo) {
  const int32_t depth = TileDepth(p.key_dim);
  if (row < 0) {
    for (int32_t j = LaneIndex(); j < depth; j += LaneCount()) hi[j] = lo[j] = 0;
    return;
  }
  const double inverse = InverseKeyNorm(p, a, g, cur, row);
  for (int32_t j = LaneIndex(); j < depth; j += LaneCount()) {
    uint16_t h = 0, l = 0;
    if (j < p.key_dim) {
      const float x = static_cast<float>(LoadElement(p, a, g, cur, row, j, false) * inverse);
      h = FloatToBFloat16Bits(x);
      l = FloatToBFloat16Bits(x - BFloat16BitsToFloat(h));  // x - hi is exact in float
    }
    hi[j] = h;
    lo[j] = l;
  }
}

// scores[r][c] (pitch kScorePitch) = row r of the 16 sources . row c of the destinations,
// for c < 16 * column_tiles (<= 64), in bf16x3. Every lane of the warp calls it (WMMA is
// warp-wide); the scores are in shared memory after WarpSync().
CKV_HD void WarpTileScores(const uint16_t* source_hi, const uint16_t* source_lo,
                           const uint16_t* dest_hi, const uint16_t* dest_lo, int32_t pitch,
                           int32_t depth, int32_t column_tiles, float* scores) {
#if defined(__CUDA_ARCH__)
  using namespace nvcuda;
  using Bf16 = __nv_bfloat16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) wmma::fill_fragment(acc[n], 0.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major> a_hi, a_lo;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major> b_hi, b_lo;
  for (int32_t k = 0; k < depth; k += 16) {
    wmma::load_matrix_sync(a_hi, reinterpret_cast<const Bf16*>(source_hi + k), pitch);
    wmma::load_matrix_sync(a_lo, reinterpret_cast<const Bf16*>(source_lo + k), pitch);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if (n < column_tiles) {  // B(k, c) = destination c, element k: column-major, ld pitch
        wmma::load_matrix_sync(b_hi, reinterpret_cast<const Bf16*>(dest_hi + n * 16 * pitch + k),
                               pitch);
        wmma::load_matrix_sync(b_lo, reinterpret_cast<const Bf16*>(dest_lo + n * 16 * pitch + k),
                               pitch);
        wmma::mma_sync(acc[n], a_hi, b_hi, acc[n]);
        wmma::mma_sync(acc[n], a_hi, b_lo, acc[n]);
        wmma::mma_sync(acc[n], a_lo, b_hi, acc[n]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    if (n < column_tiles) {
      wmma::store_matrix_sync(scores + n * 16, acc[n], kScorePitch, wmma::mem_row_major);
    }
  }
#else
  if (LaneIndex() != 0) return;
  for (int32_t r = 0; r < 16; ++r) {
    for (int32_t c = 0; c < 16 * column_tiles; ++c) {
      const uint16_t* xh = source_hi + r * pitch;
      const uint16_t* xl = source_lo + r * pitch;
      const uint16_t* yh = dest_hi + c * pitch;
      const uint16_t* yl = dest_lo + c * pitch;
      float sum = 0.0f;
      for (int32_t k = 0; k < depth; ++k) {
        sum += BFloat16BitsToFloat(xh[k]) * BFloat16BitsToFloat(yh[k]);
        sum += BFloat16BitsToFloat(xh[k]) * BFloat16BitsToFloat(yl[k]);
        sum += BFloat16BitsToFloat(xl[k]) * BFloat16BitsToFloat(yh[k]);
      }
      scores[r * kScorePitch + c] = sum;
    }
  }
#endif
}

// Folds one source's scores against destinations first .. first + count - 1 into its best
// score and near-tie list (one lane per source).
CKV_HD void FoldScores(const float* scores, int32_t first, int32_t count, double margin,
                       float* top, int32_t* tie_count, int32_t* tie_dest, float* tie_score) {
  float best = *top;
  for (int32_t c = 0; c < count; ++c) best = scores[c] > best ? scores[c] : best;
  const double floor = static_cast<double>(best) - margin;
  int32_t listed = *tie_count;
  if (best > *top && listed != kTieOverflow) {  // a higher best: drop ties now out of reach
    int32_t kept = 0;
    for (int32_t i = 0; i < listed; ++i) {
      if (static_cast<double>(tie_score[i]) < floor) continue;
      tie_dest[kept] = tie_dest[i];
      tie_score[kept] = tie_score[i];
      ++kept;
    }
    listed = kept;
  }
  *top = best;
  for (int32_t c = 0; c < count && listed != kTieOverflow; ++c) {
    if (static_cast<double>(scores[c]) < floor) continue;
    if (listed == kMaxTies) {
      listed = kTieOverflow;
      break;
    }
    tie_dest[listed] = first + c;
    tie_score[listed] = scores[c];
    ++listed;
  }
  *tie_count = listed;
}

// One block of kMatchTiles: block item `item` (TileMatchItems), shared memory `smem`
// (MakeTileLayout(key_dim).bytes, 128-byte aligned), run by warps 0 .. warps - 1 (each
// calling with its own `warp`). Writes match_count / match_ties of the tile's sources, then
// their edges (ResolveSourceEdge).
CKV_HD void TileMatchBlock(const BatchParams& p, const BatchArrays& a, const PassArgs& pass,
                           int64_t item, char* smem, int32_t warp, int32_t warps) {
  const int32_t tiles = TilesPerChunk(p);
  const int64_t chunks = ChunksPerHead(p);
  const int64_t g = item / (chunks * tiles);
  const int64_t chunk = item / tiles % chunks;
  const int32_t tile = static_cast<int32_t>(item % tiles);
  const int32_t half = (p.chunk + 1) / 2;
  const int32_t chunk_first_slot = static_cast<int32_t>(chunk * half);
  const int32_t first_slot = chunk_first_slot + tile * kTileRows;
  const int32_t head_slots = a.head_slots[g];
  if (first_slot >= head_slots) return;  // the same for the whole block
  const RowPlace place = PlaceRow(p, a, g, SlotRow(p, chunk_first_slot));
  const int32_t chunk_slots = (place.length + 1) / 2 < head_slots - chunk_first_slot
                                  ? (place.length + 1) / 2
                                  : head_slots - chunk_first_slot;
  const int32_t sources = chunk_slots - tile * kTileRows < kTileRows
                              ? chunk_slots - tile * kTileRows
                              : kTileRows;
  if (sources <= 0) return;
  const int32_t destinations = place.length / 2;
  const int32_t cur = a.head_cur[g];
  const int64_t slot_base = g * p.slot_capacity + first_slot;
  const int32_t thread = warp * LaneCount() + LaneIndex();
  const int32_t threads = warps * LaneCount();
  if (destinations == 0) {
    for (int32_t r = thread; r < sources; r += threads) {
      a.match_count[slot_base + r] = 0;
      ResolveSourceEdge(p, a, pass, slot_base + r);  // writes "no edge"
    }
    return;
  }

  const TileLayout l = MakeTileLayout(p.key_dim);
  auto* source_hi = reinterpret_cast<uint16_t*>(smem + l.source_hi);
  auto* source_lo = reinterpret_cast<uint16_t*>(smem + l.source_lo);
  auto* dest_hi = reinterpret_cast<uint16_t*>(smem + l.dest_hi);
  auto* dest_lo = reinterpret_cast<uint16_t*>(smem + l.dest_lo);
  auto* top = reinterpret_cast<float*>(smem + l.top);
  auto* tie_count = reinterpret_cast<int32_t*>(smem + l.tie_count);
  auto* tie_dest = reinterpret_cast<int32_t*>(smem + l.tie_dest);
  auto* tie_score = reinterpret_cast<float*>(smem + l.tie_score);
  const int32_t depth = TileDepth(p.key_dim);
  const double margin = 2.0 * p.bound;

  for (int32_t r = thread; r < kTileRows; r += threads) {
    top[r] = -3.0e38f;
    tie_count[r] = 0;
  }
  for (int32_t r = warp; r < kTileRows; r += warps) {  // source r: row first + 2 (slot offset)
    const int64_t row = r < sources ? place.first + 2 * (first_slot - chunk_first_slot + r) : -1;
    LoadSplitRow(p, a, g, cur, row, source_hi + r * l.pitch, source_lo + r * l.pitch);
  }
  for (int32_t d0 = 0; d0 < destinations; d0 += kTileRows) {
    const int32_t count = destinations - d0 < kTileRows ? destinations - d0 : kTileRows;
    BlockSync();  // the previous tile's products are done with dest_*
    for (int32_t r = warp; r < kTileRows; r += warps) {  // destination k: row first + 2 k + 1
      const int64_t row = r < count ? place.first + 2 * (d0 + r) + 1 : -1;
      LoadSplitRow(p, a, g, cur, row, dest_hi + r * l.pitch, dest_lo + r * l.pitch);
    }
    BlockSync();
    float* scores = reinterpret_cast<float*>(smem + l.scores) + warp * 16 * kScorePitch;
    for (int32_t m = warp; m * 16 < sources; m += warps) {  // 16 sources at a time
      WarpTileScores(source_hi + m * 16 * l.pitch, source_lo + m * 16 * l.pitch, dest_hi,
                     dest_lo, l.pitch, depth, (count + 15) / 16, scores);
      WarpSync();
      for (int32_t r = LaneIndex(); r < 16; r += LaneCount()) {
        const int32_t s = m * 16 + r;
        if (s >= sources) continue;
        FoldScores(scores + r * kScorePitch, d0, count, margin, &top[s], &tie_count[s],
                   tie_dest + s * kMaxTies, tie_score + s * kMaxTies);
      }
      WarpSync();  // the lanes are done with the scores before the next product
    }
  }
  BlockSync();
  for (int32_t r = thread; r < sources; r += threads) {  // the final list: within the margin
    const int64_t out = slot_base + r;
    const int32_t listed = tie_count[r];
    if (listed == kTieOverflow) {
      a.match_count[out] = kTieOverflow;
      continue;
    }
    const double floor = static_cast<double>(top[r]) - margin;
    int32_t kept = 0;
    for (int32_t i = 0; i < listed; ++i) {
      if (static_cast<double>(tie_score[r * kMaxTies + i]) < floor) continue;
      a.match_ties[out * kMaxTies + kept++] = tie_dest[r * kMaxTies + i];
    }
    a.match_count[out] = kept;
  }
  for (int32_t r = thread; r < sources; r += threads) {  // the lists this thread wrote
    ResolveSourceEdge(p, a, pass, slot_base + r);
  }
}

}  // namespace centroidkv::cuda
