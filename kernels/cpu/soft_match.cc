#include "kernels/cpu/soft_match.h"

#include <cassert>
#include <cmath>

namespace centroidkv::cpu {
namespace {

// Grows `buffer` to at least `size` elements (never shrinks: buffers are reused).
template <typename T>
void Reserve(std::vector<T>* buffer, int64_t size) {
  if (static_cast<int64_t>(buffer->size()) < size) buffer->resize(static_cast<size_t>(size));
}

// The first 64-byte aligned element of `p` (at most 60 bytes on).
template <typename T>
T* AlignToLine(T* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<T*>((address + 63) & ~uintptr_t{63});
}

}  // namespace

double MatchErrorBound(int32_t dim) { return std::ldexp(static_cast<double>(dim) + 8.0, -23); }

bool UsesMatrixEngine(const KernelTable& kernels, int32_t length) {
  return kernels.match_bf16x3 != nullptr && length >= kMatrixEngineMinChunk;
}

bool UsesInt16(const KernelTable& kernels, int32_t length) {
  return kernels.match_int16 != nullptr && length >= kernels.int16_min_chunk;
}

bool UsesQuantisedMatch(const KernelTable& kernels, int32_t length) {
  return UsesMatrixEngine(kernels, length) || UsesInt16(kernels, length);
}

double MatchErrorBound(const KernelTable& kernels, int32_t dim) {
  if (kernels.match_bf16x3 != nullptr) {
    return std::ldexp(1.0, -14) + std::ldexp(7.0 * dim + 64.0, -24);
  }
  if (kernels.match_int16 != nullptr) {
    const double scale = kInt16Scale;
    return 1.001 * std::sqrt(static_cast<double>(dim)) / scale + dim / (4.0 * scale * scale) +
           std::ldexp(dim / 16.0 + 32.0, -24);
  }
  return MatchErrorBound(dim);
}

double MatchErrorBound(const KernelTable& kernels, int32_t dim, int32_t chunk) {
  if (kernels.match_bf16x3 == nullptr && !UsesInt16(kernels, chunk)) return MatchErrorBound(dim);
  return MatchErrorBound(kernels, dim);
}

bool ChunkMatcher::Match(const KernelTable& kernels, const RowBlock& rows, int64_t first,
                         int32_t length, int32_t dim, RowMatch* out,
                         const PrefetchRanges* prefetch, bool check_finite,
                         const StopCheck* stop) {
  assert(length >= 2);
  kernels_ = &kernels;
  dim_ = dim;
  sources_ = (length + 1) / 2;
  destinations_ = length / 2;
  const int32_t width = kernels.panel_width;
  const int32_t num_panels = (destinations_ + width - 1) / width;
  // Sources are matched row_block at a time: rows past the chunk are read (and ignored).
  Reserve(&tile_, (static_cast<int64_t>(length) + 2 * kernels.row_block) * dim);
  Reserve(&inverse_norms_, length);
  Reserve(&panels_, static_cast<int64_t>(num_panels) * dim * width);

  rows_ = rows;
  first_ = first;
  length_ = length;
  const int64_t pair_stride = 2 * static_cast<int64_t>(dim);
  if (UsesMatrixEngine(kernels, length)) {
    // The matrix engine never widens a chunk whole: its rows are checked first.
    if (check_finite && !kernels.rows_finite(&rows, first, length, dim)) return false;
    // Scratch sizes as KernelTable::match_bf16x3 asks; tile_ and inverse_norms_ (sized above
    // for Rescore(), length >= 32 here) serve as its group buffers, so the chunk is not
    // widened whole.
    const int64_t rows_padded = (static_cast<int64_t>(length) + 63) / 64 * 64;
    const int64_t depth = 2 * ((static_cast<int64_t>(dim) + 31) / 32 * 32);
    // Tile rows are loaded 64 bytes at a time: start every buffer on a cache line.
    Reserve(&split_a_, rows_padded * depth + 32);
    Reserve(&split_b_, rows_padded * depth + 32);
    Reserve(&score_block_, 32 * rows_padded + 16);
    Reserve(&near_ties_, sources_);
    kernels.match_bf16x3(&rows, first, length, dim, tile_.data(), inverse_norms_.data(),
                         AlignToLine(split_a_.data()), AlignToLine(split_b_.data()),
                         AlignToLine(score_block_.data()), prefetch, stop,
                         2.0 * MatchErrorBound(kernels, dim), out, near_ties_.data());
    near_ties_valid_ = true;
    tile_widened_ = false;  // widened and packed on demand, for Rescore()
    tile_exact_ = false;
    panels_packed_ = false;
    return true;
  }
  // widen_rows is exact unless a row's sum of squares is above 3e38 (or NaN): an overflow of
  // finite elements, or an Inf or NaN among them.
  const bool exact =
      kernels.widen_rows(&rows, first, length, dim, tile_.data(), inverse_norms_.data());
  tile_widened_ = true;
  if (check_finite && !exact && !kernels.rows_finite(&rows, first, length, dim)) {
    tile_exact_ = false;
    panels_packed_ = false;
    near_ties_valid_ = false;
    return false;
  }
  tile_exact_ = exact && rows.type != ElemType::kF64;
  if (UsesInt16(kernels, length)) {
    const int64_t padded = (static_cast<int64_t>(dim) + 1) / 2 * 2;
    const int64_t a_rows = (sources_ + kernels.row_block - 1) / kernels.row_block *
                           kernels.row_block;
    const int64_t b_rows = (destinations_ + 15) / 16 * 16;  // panels of 8 (AVX2) or 16
    // Panels are loaded 32 or 64 bytes at a time: start both buffers on a cache line.
    Reserve(&quant_a_, (a_rows + b_rows) * padded + 32);
    Reserve(&quant_b_, b_rows * padded + 32);
    Reserve(&near_ties_, sources_);
    kernels.match_int16(tile_.data(), inverse_norms_.data(), length, dim,
                        AlignToLine(quant_a_.data()), AlignToLine(quant_b_.data()), prefetch,
                        stop, 2.0 * MatchErrorBound(kernels, dim), out, near_ties_.data());
    near_ties_valid_ = true;
    panels_packed_ = false;  // packed on demand, for Rescore()
    return true;
  }
  kernels.pack_panels(tile_.data() + dim, pair_stride, inverse_norms_.data() + 1, 2, destinations_,
                      dim, panels_.data());
  panels_packed_ = true;
  near_ties_valid_ = false;
  kernels.match_rows(tile_.data(), pair_stride, inverse_norms_.data(), 2, sources_, panels_.data(),
                     destinations_, dim, prefetch, stop, out);
  return true;
}

std::span<const float> ChunkMatcher::Rescore(int32_t source) {
  assert(kernels_ != nullptr && source >= 0 && source < sources_);
  Reserve(&scores_, destinations_);
  if (!panels_packed_) {
    if (!tile_widened_) {
      kernels_->widen_rows(&rows_, first_, length_, dim_, tile_.data(), inverse_norms_.data());
      tile_widened_ = true;
    }
    kernels_->pack_panels(tile_.data() + dim_, 2 * static_cast<int64_t>(dim_),
                          inverse_norms_.data() + 1, 2, destinations_, dim_, panels_.data());
    panels_packed_ = true;
  }
  kernels_->score_row(tile_.data() + 2 * static_cast<int64_t>(source) * dim_,
                      inverse_norms_[2 * source], panels_.data(), destinations_, dim_,
                      scores_.data());
  return {scores_.data(), static_cast<size_t>(destinations_)};
}

}  // namespace centroidkv::cpu
