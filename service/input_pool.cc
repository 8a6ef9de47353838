// InputPool: exact-size reuse of freed job input buffers, bounded by idle bytes.
#include "service/input_pool.h"

#include <iterator>

namespace centroidkv::service {

void InputReturner::operator()(uint8_t* bytes) const {
  if (pool != nullptr) {
    pool->Return(bytes, size);
  } else {
    delete[] bytes;
  }
}

std::shared_ptr<InputPool> InputPool::Create(Limits limits) {
  return std::shared_ptr<InputPool>(new InputPool(limits));
}

InputPool::~InputPool() {
  for (const auto& [size, bytes] : idle_) delete[] bytes;
}

PooledInput InputPool::Acquire(uint64_t size) {
  uint8_t* bytes = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size >= limits_.min_pooled_bytes) {
      for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
        if (it->first == size) {
          bytes = it->second;
          idle_.erase(std::next(it).base());
          --stats_.idle_buffers;
          stats_.idle_bytes -= size;
          ++stats_.reused;
          break;
        }
      }
    }
    if (bytes == nullptr) ++stats_.created;
    ++stats_.leased;
    stats_.leased_bytes += size;
  }
  if (bytes == nullptr) bytes = new uint8_t[size];  // default-initialised: not zeroed
  return PooledInput(bytes, InputReturner{shared_from_this(), size});
}

void InputPool::Return(uint8_t* bytes, uint64_t size) {
  std::vector<uint8_t*> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --stats_.leased;
    stats_.leased_bytes -= size;
    const bool keep = size >= limits_.min_pooled_bytes && size <= limits_.max_idle_bytes;
    if (keep) {
      // Make room by dropping the oldest buffers (shapes not seen lately).
      while (!idle_.empty() && stats_.idle_bytes + size > limits_.max_idle_bytes) {
        freed.push_back(idle_.front().second);
        stats_.idle_bytes -= idle_.front().first;
        --stats_.idle_buffers;
        ++stats_.trimmed;
        idle_.erase(idle_.begin());
      }
      idle_.emplace_back(size, bytes);
      stats_.idle_bytes += size;
      ++stats_.idle_buffers;
    } else {
      freed.push_back(bytes);
    }
  }
  for (uint8_t* buffer : freed) delete[] buffer;
}

InputPool::Stats InputPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace centroidkv::service
