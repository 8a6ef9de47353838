// LayerJob, the result: the CompressResult's arrays sized for the final lengths, and the
// rows written into them through the thread's BlockWriters (block_writer.h): a chunk's
// survivors (MergeChunk starts the writers), the protected rows, and every head no last pass
// wrote (Finalize), with the counts and the assignment.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/layer_job.h"
#include "oneapi/tbb/parallel_for.h"

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
  // Every array of rows but the ones the writers fill is emptied: float32 rows (also the
  // float rows of fp8 with a dynamic scale, narrowed at the end), fp16 / bf16, or fp8; none
  // but those float rows with a target (the caller's memory, a client's shared memory region).
  const ElemType written = WriterType();
  const bool fp8 = IsFp8Elem(output_type_);
  auto size = [&](auto* keys, auto* values, bool used) {
    if (used) {
      ResizeOutput(keys, total * key_dim_);
      ResizeOutput(values, total * value_dim_);
    } else {
      keys->clear();
      values->clear();
    }
  };
  const bool own_rows = !out_->rows_in_target;
  size(&out_->keys, &out_->values, written == ElemType::kF32 && (own_rows || fp8));
  size(&out_->half_keys, &out_->half_values,
       own_rows && (written == ElemType::kF16 || written == ElemType::kBF16));
  size(&out_->fp8_keys, &out_->fp8_values, own_rows && fp8);
  // fp8 scales: the options' static ones for every head; dynamic ones once the rows are known
  // (NarrowStagedRows).
  auto scales = [&](const std::vector<float>& given) {
    if (!fp8) return std::vector<float>();
    if (given.empty()) return std::vector<float>(heads_.size(), 0.0f);
    return given.size() == 1 ? std::vector<float>(heads_.size(), given[0]) : given;
  };
  out_->key_scales = scales(plan_.options.result_key_scales);
  out_->value_scales = scales(plan_.options.result_value_scales);
  if (fp8_staged_) {
    for (size_t i = 0; i < 2 * heads_.size(); ++i) row_max_bits_[i].store(0);
  }
  ResizeOutput(&out_->counts, total);
  if (with_assignment_) {
    ResizeOutput(&out_->assignment, static_cast<size_t>(layer_.num_heads) * layer_.num_tokens);
  } else {
    out_->assignment.clear();
  }
}

// The type the BlockWriters write: the result's, but float32 for fp8 with a dynamic scale.
ElemType LayerJob::WriterType() const { return fp8_staged_ ? ElemType::kF32 : output_type_; }

void LayerJob::StartOutput(int32_t head, int64_t out_row, ChunkScratch& scratch) const {
  const int64_t key_capacity = BlockWriter::Capacity(key_dim_);
  GrowScratch(&scratch.output_stage,
       static_cast<size_t>(key_capacity + BlockWriter::Capacity(value_dim_) + kLineFloats));
  float* buffer = AlignToLine(scratch.output_stage.data());
  const ElemType written = WriterType();
  void* keys = nullptr;
  void* values = nullptr;
  if (written == ElemType::kF32 && (fp8_staged_ || !out_->rows_in_target)) {
    keys = out_->keys.data() + out_row * key_dim_;
    values = out_->values.data() + out_row * value_dim_;
  } else if (out_->rows_in_target) {
    const auto element = static_cast<int64_t>(DTypeSize(out_->dtype));
    keys = static_cast<char*>(plan_.row_target->keys) + out_row * key_dim_ * element;
    values = static_cast<char*>(plan_.row_target->values) + out_row * value_dim_ * element;
  } else if (IsFp8Elem(written)) {
    keys = out_->fp8_keys.data() + out_row * key_dim_;
    values = out_->fp8_values.data() + out_row * value_dim_;
  } else {
    keys = out_->half_keys.data() + out_row * key_dim_;
    values = out_->half_values.data() + out_row * value_dim_;
  }
  const bool fp8 = IsFp8Elem(written);
  scratch.key_writer.Start(kernels_, buffer, key_dim_, written, keys,
                           fp8 ? out_->key_scales[head] : 1.0f);
  scratch.value_writer.Start(kernels_, buffer + key_capacity, value_dim_, written, values,
                             fp8 ? out_->value_scales[head] : 1.0f);
  if (fp8_staged_) {
    scratch.key_writer.NoteMaxMagnitude();
    scratch.value_writer.NoteMaxMagnitude();
  }
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
  NoteWritten(head, scratch.key_writer, scratch.value_writer);
}

namespace {

// *max = the larger of *max and `value`, for non-negative floats as bits (which order as the
// floats do).
void RaiseMax(std::atomic<uint32_t>* max, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint32_t seen = max->load(std::memory_order_relaxed);
  while (bits > seen && !max->compare_exchange_weak(seen, bits, std::memory_order_relaxed)) {
  }
}

}  // namespace

void LayerJob::NoteWritten(int32_t head, const BlockWriter& keys,
                           const BlockWriter& values) const {
  if (fp8_staged_) {
    RaiseMax(&row_max_bits_[2 * head], keys.max_magnitude());
    RaiseMax(&row_max_bits_[2 * head + 1], values.max_magnitude());
    return;
  }
  if (output_type_ == ElemType::kF32) return;
  if (!keys.fits()) keys_overflow_.store(true, std::memory_order_relaxed);
  if (!values.fits()) values_overflow_.store(true, std::memory_order_relaxed);
}

// fp8 with a dynamic scale: each head's float rows, staged in the result's float arrays, are
// narrowed with its scale (from the largest magnitude the writers saw, or the options' static
// one for the other tensor) into the fp8 arrays or the caller's memory, a head per task.
void LayerJob::NarrowStagedRows() {
  const DType dtype = plan_.options.result_dtype;
  const bool dynamic_keys = plan_.options.result_key_scales.empty();
  const bool dynamic_values = plan_.options.result_value_scales.empty();
  auto* key_codes = static_cast<uint8_t*>(out_->rows_in_target ? plan_.row_target->keys
                                                                : out_->fp8_keys.data());
  auto* value_codes = static_cast<uint8_t*>(out_->rows_in_target ? plan_.row_target->values
                                                                  : out_->fp8_values.data());
  tbb::parallel_for(int32_t{0}, layer_.num_heads, [&](int32_t h) {
    float max_keys, max_values;
    const uint32_t key_bits = row_max_bits_[2 * h].load();
    const uint32_t value_bits = row_max_bits_[2 * h + 1].load();
    std::memcpy(&max_keys, &key_bits, sizeof(max_keys));
    std::memcpy(&max_values, &value_bits, sizeof(max_values));
    if (dynamic_keys) out_->key_scales[h] = Fp8ScaleFor(max_keys, dtype);
    if (dynamic_values) out_->value_scales[h] = Fp8ScaleFor(max_values, dtype);
    const int64_t first = out_->offsets[h], rows = out_->offsets[h + 1] - first;
    NarrowToFp8(out_->keys.data() + first * key_dim_, rows * key_dim_, dtype,
                out_->key_scales[h], key_codes + first * key_dim_);
    NarrowToFp8(out_->values.data() + first * value_dim_, rows * value_dim_, dtype,
                out_->value_scales[h], value_codes + first * value_dim_);
  });
  out_->keys.clear();
  out_->values.clear();
}

void LayerJob::FinalizeHead(Head& head) {
  const int64_t first = out_->offsets[head.index];
  if (!head.written && !head.owned) {
    WriteOutputRows(head.index, Keys(head), Values(head), 0, head.length, first);
  } else if (!head.written) {  // sinks and recent rows from the input, the rest owned
    const int64_t sinks = plan_.options.sink_tokens;
    const int64_t end = head.length - plan_.options.recent_tokens;
    WriteOutputRows(head.index, InputKeys(head), InputValues(head), 0, sinks, first);
    WriteOutputRows(head.index, Keys(head), Values(head), sinks, end - sinks, first + sinks);
    WriteOutputRows(head.index, RecentKeys(head), RecentValues(head), end, head.length - end,
                    first + end);
  }
  if (!head.written) {
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
