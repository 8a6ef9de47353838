// LayerJob, the result: the CompressResult's arrays sized for the final lengths, and the
// rows written into them through the thread's BlockWriters (block_writer.h): a chunk's
// survivors (MergeChunk starts the writers), the protected rows, and every head no last pass
// wrote (Finalize), with the counts and the assignment.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <numeric>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/layer_job.h"

namespace centroidkv::cpu {
namespace {

// Sizes an output vector, which is empty (Compress) or holds an earlier result
// (CompressInto): its elements are all overwritten, so a reused vector at least as long is
// only shrunk, and only growth is zero-filled. Writing fresh memory first touches every page
// of it, and a page fault per 4 KiB page costs more than computing the rows (several times
// over in a VM), so new memory is marked for transparent huge pages first (a hint; Linux).
template <typename T>
void ResizeOutput(std::vector<T>* vector, size_t size) {
  if (vector->capacity() < size) {
    vector->clear();
    vector->shrink_to_fit();
    vector->reserve(size);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    constexpr uintptr_t kPage = 4096;
    const auto begin = (reinterpret_cast<uintptr_t>(vector->data()) + kPage - 1) & ~(kPage - 1);
    const auto end = reinterpret_cast<uintptr_t>(vector->data() + size) & ~(kPage - 1);
    if (size * sizeof(T) >= (size_t{4} << 20) && end > begin) {
      madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    }
#endif
  }
  vector->resize(size);
}

constexpr int64_t kLineFloats = 64 / sizeof(float);

// The first 64-byte boundary at or after p.
float* AlignToLine(float* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return p + ((64 - (address & 63)) & 63) / sizeof(float);
}

}  // namespace

// The CompressResult's arrays for the final lengths (the lengths after this pass's merges).
void LayerJob::AllocateOutput() {
  if (output_allocated_) return;
  output_allocated_ = true;
  out_->num_heads = layer_.num_heads;
  out_->num_tokens = layer_.num_tokens;
  out_->key_dim = key_dim_;
  out_->value_dim = value_dim_;
  out_->offsets.assign(1, 0);
  for (const Head& head : heads_)
    out_->offsets.push_back(out_->offsets.back() + head.length - head.merges);
  const auto total = static_cast<size_t>(out_->offsets.back());
  out_->dtype = plan_.options.result_dtype;
  out_->rows_in_target = plan_.row_target != nullptr;
  // Every array of rows but the one this dtype fills (none with a target: the rows go to the
  // caller's memory, a client's shared memory region) is emptied.
  const bool own_rows = !out_->rows_in_target;
  auto size = [&](auto* keys, auto* values, bool used) {
    if (own_rows && used) {
      ResizeOutput(keys, total * key_dim_);
      ResizeOutput(values, total * value_dim_);
    } else {
      keys->clear();
      values->clear();
    }
  };
  const bool fp8 = IsFp8Elem(output_type_);
  const bool half = output_type_ == ElemType::kF16 || output_type_ == ElemType::kBF16;
  size(&out_->keys, &out_->values, output_type_ == ElemType::kF32);
  size(&out_->half_keys, &out_->half_values, half);
  size(&out_->fp8_keys, &out_->fp8_values, fp8);
  // fp8 rows in the static scales of the options (the engine asks only with static ones).
  auto scales = [&](const std::vector<float>& given) {
    if (!fp8) return std::vector<float>();
    assert(!given.empty());
    return given.size() == 1 ? std::vector<float>(heads_.size(), given[0]) : given;
  };
  out_->key_scales = scales(plan_.options.result_key_scales);
  out_->value_scales = scales(plan_.options.result_value_scales);
  ResizeOutput(&out_->counts, total);
  if (with_assignment_) {
    ResizeOutput(&out_->assignment, static_cast<size_t>(layer_.num_heads) * layer_.num_tokens);
  } else {
    out_->assignment.clear();
  }
}

void LayerJob::StartOutput(int32_t head, int64_t out_row, ChunkScratch& scratch) const {
  const int64_t key_capacity = BlockWriter::Capacity(key_dim_);
  GrowScratch(&scratch.output_stage,
       static_cast<size_t>(key_capacity + BlockWriter::Capacity(value_dim_) + kLineFloats));
  float* buffer = AlignToLine(scratch.output_stage.data());
  void* keys = nullptr;
  void* values = nullptr;
  if (out_->rows_in_target) {
    const auto element = static_cast<int64_t>(DTypeSize(out_->dtype));
    keys = static_cast<char*>(plan_.row_target->keys) + out_row * key_dim_ * element;
    values = static_cast<char*>(plan_.row_target->values) + out_row * value_dim_ * element;
  } else if (output_type_ == ElemType::kF32) {
    keys = out_->keys.data() + out_row * key_dim_;
    values = out_->values.data() + out_row * value_dim_;
  } else if (IsFp8Elem(output_type_)) {
    keys = out_->fp8_keys.data() + out_row * key_dim_;
    values = out_->fp8_values.data() + out_row * value_dim_;
  } else {
    keys = out_->half_keys.data() + out_row * key_dim_;
    values = out_->half_values.data() + out_row * value_dim_;
  }
  const bool fp8 = IsFp8Elem(output_type_);
  scratch.key_writer.Start(kernels_, buffer, key_dim_, output_type_, keys,
                           fp8 ? out_->key_scales[head] : 1.0f);
  scratch.value_writer.Start(kernels_, buffer + key_capacity, value_dim_, output_type_, values,
                             fp8 ? out_->value_scales[head] : 1.0f);
}

void LayerJob::WriteOutputRows(int32_t head, const RowBlock& keys, const RowBlock& values,
                               int64_t first, int64_t count, int64_t out_row) const {
  if (count <= 0) return;
  ChunkScratch& scratch = scratch_->local();
  StartOutput(head, out_row, scratch);
  for (int64_t row = first; row < first + count; ++row) {
    kernels_.convert_row_f32(&keys, row, key_dim_, scratch.key_writer.Next());
    kernels_.convert_row_f32(&values, row, value_dim_, scratch.value_writer.Next());
  }
  scratch.key_writer.Finish();
  scratch.value_writer.Finish();
  FenceStreamedStores();
  if (values_at_output_ && !scratch.value_writer.finite()) bad_input_.store(true);
  NoteRounding(scratch.key_writer, scratch.value_writer);
}

void LayerJob::NoteRounding(const BlockWriter& keys, const BlockWriter& values) const {
  if (output_type_ == ElemType::kF32) return;
  if (!keys.fits()) keys_overflow_.store(true, std::memory_order_relaxed);
  if (!values.fits()) values_overflow_.store(true, std::memory_order_relaxed);
}

void LayerJob::FinalizeHead(Head& head) {
  const int64_t first = out_->offsets[head.index];
  if (!head.written) {
    WriteOutputRows(head.index, Keys(head), Values(head), 0, head.length, first);
    for (int64_t row = 0; row < head.length; ++row) {
      out_->counts[first + row] = static_cast<uint32_t>(head.counts[row]);
    }
  }
  if (!with_assignment_) return;
  int32_t* assignment =
      out_->assignment.data() + static_cast<size_t>(head.index) * layer_.num_tokens;
  if (head.owner.empty()) {
    std::iota(assignment, assignment + layer_.num_tokens, 0);
  } else {
    std::copy(head.owner.begin(), head.owner.end(), assignment);
  }
}

}  // namespace centroidkv::cpu
