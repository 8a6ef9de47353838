// One shared memory region a client registered: its file under the shared memory directory
// opened (no symlinks), checked (a regular file owned by the client's uid or an allowed
// one, large enough), and mapped read-write. The mapping lives as long as the last
// shared_ptr: the region table holds one, and every job that reads or writes the region
// holds another, so unregistering a region (or its owner dying) while a job uses it
// never unmaps memory under the job. The mapping is guarded against the client truncating
// the file under it (SigbusGuard): a fault past the file's end leaves zero pages and marks
// the region truncated for good. Thread-safe after Map().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "service/shm/sigbus_guard.h"

namespace centroidkv::service {

class MappedRegion {
 public:
  // `name`: "/ckv-x" (a POSIX shm name) or "<shm_dir>/ckv-x"; both mean <shm_dir>/ckv-x.
  // `owner_uids`: uids whose files may be mapped (the peer's own uid and the allowlist).
  // INVALID_ARGUMENT naming name/offset/size for a bad request, PERMISSION_DENIED for a
  // file of another uid, NOT_FOUND for a missing file.
  static absl::StatusOr<std::shared_ptr<MappedRegion>> Map(const std::string& shm_dir,
                                                           const std::string& name,
                                                           uint64_t offset, uint64_t size,
                                                           const std::vector<uint32_t>& owner_uids);
  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  // The region's first byte (the file's byte `offset`).
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  uint64_t offset() const { return offset_; }
  // FAILED_PRECONDITION when the file has shrunk below the region since it was mapped
  // (touching the missing pages would raise SIGBUS): checked before each job uses it.
  absl::Status CheckStillBacked() const;
  // Whether an access faulted because the file had been truncated: the mapping then holds
  // zero pages instead of the file, for good (sigbus_guard.h).
  bool truncated() const { return guard_.truncated(); }
  // The first address that faulted, or 0.
  uintptr_t fault_address() const { return guard_.fault_address(); }

 private:
  MappedRegion() = default;

  std::string name_;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
  int fd_ = -1;                  // kept open for CheckStillBacked
  void* mapping_ = nullptr;      // page-aligned start of the mapping
  size_t mapping_bytes_ = 0;
  uint8_t* data_ = nullptr;
  SigbusGuard guard_;  // released before the munmap
};

}  // namespace centroidkv::service
