// The result block writer of the CPU engine: rows written one after another into one block
// of a CompressResult's rows (float32, or fp16 / bf16 rounded once) through a staging buffer
// in L1, streamed out with non-temporal stores; and the fence that orders those stores.
// LayerJob (layer_job.h) gives every chunk task a pair of them (keys, values).
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

// Writes rows, one after another, to one contiguous block of the CompressResult's rows
// (float32, or fp16 / bf16 / fp8: each float rounded once) through a small staging buffer of
// floats that stays in L1: every 64-byte line of the block that is complete goes out at once
// with a non-temporal store (KernelTable::stream_floats / stream_halves), so the stores
// drain to memory while the next rows are computed, and no read-for-ownership of the result
// lines. The first and last partial lines of the block (which it may share with a
// block another thread writes) get plain stores. The caller fences (sfence) before the block
// is read. On the way it notes whether every float written is finite.
class BlockWriter {
 public:
  // `buffer`: 64-byte aligned, Capacity(dim) floats. `out`: elements of `type` (kF32, kF16,
  // kBF16, or fp8: each float divided by `scale` and rounded once, saturating, as
  // NarrowToFp8 of common/dtype.h does).
  static int64_t Capacity(int32_t dim);
  void Start(const KernelTable& kernels, float* buffer, int32_t dim, ElemType type, void* out,
             float scale = 1.0f);
  // Also notes the largest magnitude of the floats written (max_magnitude()).
  void NoteMaxMagnitude() { note_max_magnitude_ = true; }
  // Where to put the next row (dim floats): valid until the next call.
  float* Next() {
    if (staged_ + dim_ > capacity_) Flush(/*final=*/false);
    float* row = stage_ + staged_;
    staged_ += dim_;
    return row;
  }
  // Writes out every staged row.
  void Finish() { Flush(/*final=*/true); }
  // Whether every float written since Start is finite (no Inf or NaN).
  bool finite() const { return finite_; }
  // Whether every element written since Start is finite in the block's type (an fp16 /
  // bf16 rounding made no Inf; float rows: finite(); fp8 saturates: always).
  bool fits() const { return fits_; }
  // The largest magnitude of the floats written since Start (NaN ignored), where
  // NoteMaxMagnitude was called; else 0.
  float max_magnitude() const { return max_magnitude_; }

 private:
  void Flush(bool final);

  const KernelTable* kernels_ = nullptr;
  float* buffer_ = nullptr;
  int64_t capacity_ = 0;  // floats from stage_ (stage_ - buffer_ < 32)
  int32_t dim_ = 0;
  ElemType type_ = ElemType::kF32;
  float scale_ = 1.0f;         // fp8
  int64_t element_bytes_ = 4;  // of `type_`
  char* out_ = nullptr;        // where stage_[0] goes
  float* stage_ = nullptr;
  int64_t staged_ = 0;
  bool finite_ = true;
  bool fits_ = true;
  bool note_max_magnitude_ = false;
  float max_magnitude_ = 0.0f;
};

// Orders the non-temporal stores of KernelTable::stream_floats before every later store
// (the end of the task, after which other threads read the rows). sfence is baseline x86-64.
inline void FenceStreamedStores() {
#if defined(__SSE__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace centroidkv::cpu
