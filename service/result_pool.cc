// ResultPool: a vector of idle results under a mutex, best-fit leasing, LRU trimming.
#include "service/result_pool.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace centroidkv::service {

void ResultReturner::operator()(CompressResult* result) const {
  if (pool != nullptr) {
    pool->Return(result);
  } else {
    delete result;
  }
}

std::shared_ptr<ResultPool> ResultPool::Create(Limits limits) {
  return std::shared_ptr<ResultPool>(new ResultPool(limits));
}

uint64_t ResultPool::CapacityBytes(const CompressResult& result) {
  return result.offsets.capacity() * sizeof(int64_t) + result.keys.capacity() * sizeof(float) +
         result.values.capacity() * sizeof(float) +
         (result.half_keys.capacity() + result.half_values.capacity()) * sizeof(uint16_t) +
         result.fp8_keys.capacity() + result.fp8_values.capacity() +
         result.fp8_input_scratch.capacity() * sizeof(float) +
         (result.key_scales.capacity() + result.value_scales.capacity()) * sizeof(float) +
         result.counts.capacity() * sizeof(uint32_t) +
         result.assignment.capacity() * sizeof(int32_t);
}

uint64_t ResultPool::ResultBytesFor(const LayerView& layer, const CompressOptions& options) {
  // Called before the engine validates the options: clamp in double (NaN -> 1) first.
  const int64_t n = std::max<int64_t>(layer.num_tokens, 1);
  double target = options.target_tokens.has_value()
                      ? static_cast<double>(*options.target_tokens)
                      : std::ceil(options.target_ratio.value_or(
                                      CompressOptions::kDefaultTargetRatio) *
                                  static_cast<double>(n));
  if (!(target >= 1.0)) target = 1.0;
  int64_t t = std::min<int64_t>(n, static_cast<int64_t>(std::min<double>(target, n)));
  const int64_t protected_rows =
      std::max<int64_t>(options.sink_tokens, 0) + std::max<int64_t>(options.recent_tokens, 0);
  t = std::max(t, std::min(n, protected_rows));
  int64_t passthrough = 0;
  for (int32_t head = 0; head < layer.num_heads; ++head) {
    if (std::find(options.passthrough_heads.begin(), options.passthrough_heads.end(), head) !=
        options.passthrough_heads.end()) {
      ++passthrough;
    }
  }
  const uint64_t rows = static_cast<uint64_t>(passthrough * n + (layer.num_heads - passthrough) * t);
  uint64_t bytes = (static_cast<uint64_t>(layer.num_heads) + 1) * sizeof(int64_t);
  // fp8 rows are quantised from float32 rows the result holds first.
  const int32_t row_element_bytes =
      DTypeSize(options.result_dtype) + (IsFp8(options.result_dtype) ? 4 : 0);
  bytes += rows * (static_cast<uint64_t>(layer.key_dim) + layer.value_dim) * row_element_bytes;
  bytes += rows * sizeof(uint32_t);
  if (options.compute_assignment) {
    bytes += static_cast<uint64_t>(layer.num_heads) * static_cast<uint64_t>(n) * sizeof(int32_t);
  }
  return bytes;
}

PooledResult ResultPool::Acquire(uint64_t wanted_bytes) {
  std::unique_ptr<CompressResult> result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (best == idle_.end()) {
        best = it;
        continue;
      }
      const bool fits = it->bytes >= wanted_bytes;
      const bool best_fits = best->bytes >= wanted_bytes;
      if (fits ? (!best_fits || it->bytes < best->bytes) : (!best_fits && it->bytes > best->bytes)) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      result = std::move(best->result);
      stats_.idle_bytes -= best->bytes;
      --stats_.idle_results;
      idle_.erase(best);
      ++stats_.reused;
    } else {
      ++stats_.created;
    }
    ++stats_.leased;
  }
  if (result == nullptr) result = std::make_unique<CompressResult>();
  return PooledResult(result.release(), ResultReturner{shared_from_this()});
}

void ResultPool::Return(CompressResult* returned) {
  std::unique_ptr<CompressResult> result(returned);
  const uint64_t bytes = CapacityBytes(*result);
  std::vector<Idle> freed;  // destroyed after the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    --stats_.leased;
    if (limits_.max_idle_results <= 0 || bytes > limits_.max_idle_bytes) {
      ++stats_.trimmed;
      return;  // too large to keep at all; freed with `result` (the lock is released first)
    }
    idle_.push_back(Idle{std::move(result), bytes});
    stats_.idle_bytes += bytes;
    ++stats_.idle_results;
    // Over a bound: free the least recently returned first.
    size_t drop = 0;
    while (drop < idle_.size() &&
           (stats_.idle_results > limits_.max_idle_results ||
            stats_.idle_bytes > limits_.max_idle_bytes)) {
      stats_.idle_bytes -= idle_[drop].bytes;
      --stats_.idle_results;
      ++stats_.trimmed;
      ++drop;
    }
    if (drop > 0) {
      freed.reserve(drop);
      for (size_t i = 0; i < drop; ++i) freed.push_back(std::move(idle_[i]));
      idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(drop));
    }
  }
}

ResultPool::Stats ResultPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace centroidkv::service
