// The cancel flags of every job the server has handed to its pool, so that shutdown can
// cancel them all at the end of the grace period, whatever stream (alive or already
// finished) they belong to. A job registers its flag when submitted and removes it when
// its computation returns; CancelAll() sets every registered flag and every later one.
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>

namespace centroidkv::service {

class JobCancellation {
 public:
  using Flag = std::shared_ptr<std::atomic<bool>>;

  // A new flag, registered; already set once CancelAll() has run.
  Flag Register();
  void Unregister(const Flag& flag);
  // Sets every registered flag, and makes every later Register() return a set flag.
  void CancelAll();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  bool all_cancelled_ = false;
  std::set<Flag> flags_;
};

}  // namespace centroidkv::service
