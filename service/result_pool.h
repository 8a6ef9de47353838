// The server's pool of CompressResult buffers, reused across jobs so that each job's
// float32 result (~134 MB for a 32k-token x 8-head layer) is not faulted in and
// zero-filled again (ClusterEngine::CompressInto). It owns the idle results only: a job
// leases one (PooledResult) for its whole life, from RunJob until the ResultEncoder has
// copied the last slab out of it, and the lease returns it on destruction, whatever path
// the job took. Idle results are bounded by count and by bytes (their capacity); over
// either bound the least recently returned ones are freed.
// Thread-safe; buffers are freed outside the lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "centroidkv/kernels/engine.h"

namespace centroidkv::service {

class ResultPool;

// Returns a leased result to its pool (or deletes it when it has none).
struct ResultReturner {
  std::shared_ptr<ResultPool> pool;
  void operator()(CompressResult* result) const;
};
using PooledResult = std::unique_ptr<CompressResult, ResultReturner>;

class ResultPool : public std::enable_shared_from_this<ResultPool> {
 public:
  struct Limits {
    int32_t max_idle_results = 0;  // 0 = keep nothing (every job allocates afresh)
    uint64_t max_idle_bytes = 0;
  };
  struct Stats {
    int64_t idle_results = 0;
    uint64_t idle_bytes = 0;     // capacity of the idle results' arrays
    int64_t leased = 0;          // results held by jobs now
    int64_t reused = 0;          // leases served from an idle result
    int64_t created = 0;         // leases that started from an empty result
    int64_t trimmed = 0;         // results freed on return to stay within the limits
  };

  // Leases keep the pool alive, so it is always created shared.
  static std::shared_ptr<ResultPool> Create(Limits limits);

  // An idle result (the one whose capacity best fits `wanted_bytes`: the smallest that
  // holds it, else the largest), or an empty one. Its contents are any earlier result.
  PooledResult Acquire(uint64_t wanted_bytes);

  Stats stats() const;
  const Limits& limits() const { return limits_; }

  // Bytes the arrays of `result` hold allocated (capacity, not size).
  static uint64_t CapacityBytes(const CompressResult& result);
  // The bytes of the float32 result of a job of this shape when each compressed head
  // reaches its target length t (or keeps its S + W protected rows, if more): what the
  // engine returns for mergeable data; a head that merges less returns more rows.
  static uint64_t ResultBytesFor(const LayerView& layer, const CompressOptions& options);

 private:
  friend struct ResultReturner;
  struct Idle {
    std::unique_ptr<CompressResult> result;
    uint64_t bytes = 0;
  };

  explicit ResultPool(Limits limits) : limits_(limits) {}
  void Return(CompressResult* result);

  const Limits limits_;
  mutable std::mutex mu_;
  std::vector<Idle> idle_;  // oldest first
  Stats stats_;
};

}  // namespace centroidkv::service
