#include "kernels/cpu/soft_match.h"

#include <cassert>
#include <cmath>

namespace centroidkv::cpu {
namespace {

// Grows `buffer` to at least `size` elements (never shrinks: buffers are reused).
void Reserve(std::vector<float>* buffer, int64_t size) {
  if (static_cast<int64_t>(buffer->size()) < size) buffer->resize(static_cast<size_t>(size));
}

}  // namespace

double MatchErrorBound(int32_t dim) { return std::ldexp(static_cast<double>(dim) + 8.0, -23); }

void ChunkMatcher::Match(const KernelTable& kernels, const RowBlock& rows, int64_t first,
                         int32_t length, int32_t dim, RowMatch* out,
                         const PrefetchRanges* prefetch) {
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

  const bool exact =
      kernels.widen_rows(&rows, first, length, dim, tile_.data(), inverse_norms_.data());
  tile_exact_ = exact && rows.type != ElemType::kF64;
  const int64_t pair_stride = 2 * static_cast<int64_t>(dim);
  kernels.pack_panels(tile_.data() + dim, pair_stride, inverse_norms_.data() + 1, 2, destinations_,
                      dim, panels_.data());
  kernels.match_rows(tile_.data(), pair_stride, inverse_norms_.data(), 2, sources_, panels_.data(),
                     destinations_, dim, prefetch, out);
}

std::span<const float> ChunkMatcher::Rescore(int32_t source) {
  assert(kernels_ != nullptr && source >= 0 && source < sources_);
  Reserve(&scores_, destinations_);
  kernels_->score_row(tile_.data() + 2 * static_cast<int64_t>(source) * dim_,
                      inverse_norms_[2 * source], panels_.data(), destinations_, dim_,
                      scores_.data());
  return {scores_.data(), static_cast<size_t>(destinations_)};
}

}  // namespace centroidkv::cpu
