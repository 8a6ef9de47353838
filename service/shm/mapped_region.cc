// MappedRegion: open, check ownership and size, mmap; munmap on the last reference.
#include "service/shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv::service {

absl::StatusOr<std::shared_ptr<MappedRegion>> MappedRegion::Map(
    const std::string& shm_dir, const std::string& name, uint64_t offset, uint64_t size,
    const std::vector<uint32_t>& owner_uids) {
  // The file's name within shm_dir: one path component, no "..", no hidden tricks.
  std::string base = name;
  if (absl::StartsWith(base, shm_dir + "/")) {
    base = base.substr(shm_dir.size() + 1);
  } else if (absl::StartsWith(base, "/")) {
    base = base.substr(1);
  }
  if (base.empty() || base == "." || base == ".." || absl::StrContains(base, "/") ||
      base.size() > 255) {
    return InvalidFieldError(
        {"name"}, absl::StrCat("name '", name, "' is not a POSIX shared memory name ('/x') or ",
                               "a file directly under ", shm_dir));
  }
  const long page = sysconf(_SC_PAGESIZE);
  if (size == 0) return InvalidFieldError({"size"}, "size must be positive");
  if (offset % static_cast<uint64_t>(page) != 0) {
    return InvalidFieldError({"offset"}, absl::StrCat("offset ", offset,
                                                      " is not a multiple of the page size ",
                                                      page));
  }
  if (offset + size < offset) return InvalidFieldError({"size"}, "offset + size overflows");
  const std::string path = absl::StrCat(shm_dir, "/", base);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    const std::string why = absl::StrCat("cannot open '", path, "': ", std::strerror(error));
    if (error == ENOENT) return FieldError(absl::StatusCode::kNotFound, {"name"}, why);
    if (error == EACCES || error == EPERM || error == ELOOP) {
      return FieldError(absl::StatusCode::kPermissionDenied, {"name"}, why);
    }
    return InvalidFieldError({"name"}, why);
  }
  std::shared_ptr<MappedRegion> region(new MappedRegion());
  region->fd_ = fd;  // closed by the destructor from here on
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    return InvalidFieldError({"name"}, absl::StrCat("'", path, "' is not a regular file"));
  }
  if (std::find(owner_uids.begin(), owner_uids.end(), info.st_uid) == owner_uids.end()) {
    return FieldError(absl::StatusCode::kPermissionDenied, {"name"},
                      absl::StrCat("'", path, "' belongs to uid ", info.st_uid,
                                   "; this caller may register only files of uid ",
                                   absl::StrJoin(owner_uids, ", uid "),
                                   " (its own, SO_PEERCRED, or the server's "
                                   "--shared-memory-owner-uids)"));
  }
  if (static_cast<uint64_t>(info.st_size) < offset + size) {
    return InvalidFieldError({"size"}, absl::StrCat("'", path, "' holds ", info.st_size,
                                                    " bytes; offset + size is ", offset + size));
  }
  void* mapping = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(offset));
  if (mapping == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map '", path, "': ", std::strerror(errno)));
  }
  region->mapping_ = mapping;  // unmapped by the destructor from here on
  region->mapping_bytes_ = size;
  absl::StatusOr<SigbusGuard> guard = SigbusGuard::Guard(mapping, size);
  if (!guard.ok()) return guard.status();
  region->guard_ = *std::move(guard);
  region->name_ = name;
  region->offset_ = offset;
  region->size_ = size;
  region->data_ = static_cast<uint8_t*>(mapping);
  return region;
}

MappedRegion::~MappedRegion() {
  guard_.Release();  // no handler may touch the range once it is unmapped
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  if (fd_ >= 0) close(fd_);
}

absl::Status MappedRegion::CheckStillBacked() const {
  struct stat info {};
  if (fstat(fd_, &info) != 0 || static_cast<uint64_t>(info.st_size) < offset_ + size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("region '", name_, "': its file shrank below offset + size (",
                     offset_ + size_, " bytes) after it was registered"));
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::service
