// JobCancellation: a set of shared flags under a mutex.
#include "service/job_cancellation.h"

namespace centroidkv::service {

JobCancellation::Flag JobCancellation::Register() {
  std::lock_guard<std::mutex> lock(mu_);
  Flag flag = std::make_shared<std::atomic<bool>>(all_cancelled_);
  flags_.insert(flag);
  return flag;
}

void JobCancellation::Unregister(const Flag& flag) {
  std::lock_guard<std::mutex> lock(mu_);
  flags_.erase(flag);
}

void JobCancellation::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  all_cancelled_ = true;
  for (const Flag& flag : flags_) flag->store(true);
}

size_t JobCancellation::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flags_.size();
}

}  // namespace centroidkv::service
