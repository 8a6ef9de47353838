// BlockWriter (block_writer.h): staging rows in L1 and streaming whole 64-byte lines of the
// result block out (fp8 rows narrowed with plain stores: a quarter of float32's bytes).
#include "kernels/cpu/block_writer.h"

#include <algorithm>
#include <cstring>

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/fp8_elements.h"

namespace centroidkv::cpu {
namespace {

// Elements of the narrowest result type (fp8) in a 64-byte line.
constexpr int64_t kLineElements = 64;
// How much a BlockWriter stages before it writes out its complete lines: a few rows, well
// inside L1 with everything else a merge reads.
constexpr int64_t kStageFloats = 1024;

// Elements of `element_bytes` from the 64-byte line boundary at or before p to p (p is
// aligned to its elements).
int64_t LineOffset(const void* p, int64_t element_bytes) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) & 63) / element_bytes;
}

}  // namespace

// Room for two lines of the narrowest type (64 elements), rounded up to whole lines of
// it, so that buffers placed one after another stay aligned.
int64_t BlockWriter::Capacity(int32_t dim) {
  const int64_t floats = std::max<int64_t>(kStageFloats, dim) + 2 * kLineElements;
  return (floats + kLineElements - 1) / kLineElements * kLineElements;
}

// The staged rows sit at out's offset (in elements) within a line, so each whole line of the
// block is one or two whole, aligned lines of the buffer.
void BlockWriter::Start(const KernelTable& kernels, float* buffer, int32_t dim, ElemType type,
                        void* out, float scale) {
  kernels_ = &kernels;
  buffer_ = buffer;
  dim_ = dim;
  type_ = type;
  scale_ = scale;
  element_bytes_ = ElemTypeBytes(type);
  out_ = static_cast<char*>(out);
  stage_ = buffer + LineOffset(out, element_bytes_);
  capacity_ = Capacity(dim) - (stage_ - buffer);
  staged_ = 0;
  finite_ = true;
  fits_ = true;
  note_max_magnitude_ = false;
  max_magnitude_ = 0.0f;
}

// Writes out the staged floats up to the last line boundary of the block (all of them when
// `final`) and moves the rest, less than a line, to the front of the buffer. Not final, it
// runs only when a row does not fit, so more than a line is staged (Capacity).
void BlockWriter::Flush(bool final) {
  int64_t count = staged_;
  if (!final) count -= LineOffset(out_ + staged_ * element_bytes_, element_bytes_);
  if (note_max_magnitude_) max_magnitude_ = std::max(max_magnitude_, MaxMagnitude(stage_, count));
  if (type_ == ElemType::kF32) {
    finite_ &= kernels_->stream_floats(stage_, count, reinterpret_cast<float*>(out_));
    fits_ = finite_;
  } else if (IsFp8Elem(type_)) {  // saturating: every element fits
    const RowBlock staged{stage_, ElemType::kF32, count};
    finite_ &= count == 0 || kernels_->rows_finite(&staged, 0, 1, static_cast<int32_t>(count));
    NarrowToFp8(stage_, count, Fp8DTypeOf(type_), scale_, reinterpret_cast<uint8_t*>(out_));
  } else {
    const uint32_t flags =
        kernels_->stream_halves(stage_, count, type_, reinterpret_cast<uint16_t*>(out_));
    finite_ &= (flags & kStreamedNonFinite) == 0;
    fits_ &= (flags & kStreamedBeyondRange) == 0;
  }
  const int64_t rest = staged_ - count;
  std::memmove(buffer_, stage_ + count, sizeof(float) * rest);
  out_ += count * element_bytes_;
  stage_ = buffer_;
  capacity_ = Capacity(dim_);
  staged_ = rest;
}

}  // namespace centroidkv::cpu
