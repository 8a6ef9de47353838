// CallerRegistry and CallerStream: per-caller streams, jobs and bytes against the limits.
#include "service/security/caller_limits.h"

#include "absl/strings/str_cat.h"

namespace centroidkv::service {

absl::StatusOr<std::unique_ptr<CallerStream>> CallerRegistry::OpenStream(
    const std::string& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  CallerUsage& usage = accounts_[caller];
  if (limits_.max_streams > 0 && usage.streams >= limits_.max_streams) {
    if (usage.streams == 0 && usage.jobs == 0) accounts_.erase(caller);
    return absl::ResourceExhaustedError(absl::StrCat(
        "caller '", caller, "' already has ", limits_.max_streams,
        " streams open (max_caller_streams)"));
  }
  ++usage.streams;
  return std::make_unique<CallerStream>(this, caller);
}

CallerUsage CallerRegistry::usage(const std::string& caller) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = accounts_.find(caller);
  return it == accounts_.end() ? CallerUsage{} : it->second;
}

absl::Status CallerRegistry::Admit(const std::string& caller, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CallerUsage& usage = accounts_[caller];
  if (limits_.max_jobs > 0 && usage.jobs >= limits_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "start_job: caller '", caller, "' already has ", usage.jobs,
        " jobs in flight (max_caller_jobs ", limits_.max_jobs, ")"));
  }
  if (limits_.max_bytes > 0 && usage.bytes + bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "start_job: caller '", caller, "' holds ", usage.bytes, " bytes and this job needs ",
        bytes, " more (max_caller_bytes ", limits_.max_bytes, ")"));
  }
  ++usage.jobs;
  usage.bytes += bytes;
  return absl::OkStatus();
}

void CallerRegistry::Release(const std::string& caller, int32_t streams, int32_t jobs,
                             uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = accounts_.find(caller);
  if (it == accounts_.end()) return;
  it->second.streams -= streams;
  it->second.jobs -= jobs;
  it->second.bytes -= bytes;
  if (it->second.streams == 0 && it->second.jobs == 0) accounts_.erase(it);
}

CallerStream::~CallerStream() {
  registry_->Release(caller_, stream_open_ ? 1 : 0, jobs_, bytes_);
}

absl::Status CallerStream::AdmitJob(uint64_t bytes) {
  if (absl::Status status = registry_->Admit(caller_, bytes); !status.ok()) return status;
  ++jobs_;
  bytes_ += bytes;
  return absl::OkStatus();
}

void CallerStream::ReleaseJob(uint64_t bytes) {
  if (bytes == 0 || jobs_ == 0) return;
  const uint64_t released = std::min(bytes, bytes_);
  --jobs_;
  bytes_ -= released;
  registry_->Release(caller_, 0, 1, released);
}

void CallerStream::EndStream() {
  if (!stream_open_) return;
  stream_open_ = false;
  registry_->Release(caller_, 1, 0, 0);
}

}  // namespace centroidkv::service
