// RegionTable: owners, registration, lookup and the pidfd watcher.
#include "service/shm/region_table.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"

namespace centroidkv::service {
namespace {

int PidfdOpen(int32_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

RegionTable::RegionTable(const SharedMemoryOptions& options) : options_(options) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  watcher_ = std::thread([this] { Watch(); });
}

RegionTable::~RegionTable() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  Wake();
  watcher_.join();
  for (auto& [key, owner] : owners_) {
    if (owner.pidfd >= 0) close(owner.pidfd);
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RegionTable::SetPeerLookup(
    std::function<std::optional<PeerCredentials>(const std::string&)> lookup) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_lookup_ = std::move(lookup);
}

absl::StatusOr<RegionOwner> RegionTable::OwnerOf(const std::string& peer,
                                                 const std::string& caller) const {
  if (!options_.enabled) {
    return absl::FailedPreconditionError(
        "shared memory: off on this server (--shared-memory=false); send tensors as slabs");
  }
  std::function<std::optional<PeerCredentials>(const std::string&)> lookup;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lookup = peer_lookup_;
  }
  std::optional<PeerCredentials> credentials;
  if (lookup) credentials = lookup(peer);
  RegionOwner owner;
  owner.file_uids = options_.owner_uids;
  if (credentials.has_value()) {
    owner.file_uids.push_back(credentials->uid);
    owner.pid = credentials->pid;
    owner.key = credentials->pid > 0 ? absl::StrCat("pid:", credentials->pid)
                                     : absl::StrCat("caller:", caller);
    return owner;
  }
  if (!options_.allow_tcp || absl::StartsWith(peer, "fd:")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory: offered only to clients on the server's unix socket (this call came "
        "from '", peer, "'); send tensors as slabs, or connect over unix://"));
  }
  // TCP allowed explicitly: the files of the allowlisted uids (or the server's own).
  if (owner.file_uids.empty()) owner.file_uids.push_back(static_cast<uint32_t>(geteuid()));
  owner.key = absl::StrCat("caller:", caller);
  return owner;
}

absl::StatusOr<RegionInfo> RegionTable::Register(const RegionOwner& owner,
                                                 const std::string& name, uint64_t offset,
                                                 uint64_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(owner.key);
    const size_t held = it == owners_.end() ? 0 : it->second.regions.size();
    if (held >= static_cast<size_t>(options_.max_regions_per_owner) ||
        count_ >= static_cast<size_t>(options_.max_regions)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shared memory: ", held, " regions registered by this client and ", count_,
          " in all; the server takes at most ", options_.max_regions_per_owner,
          " per client and ", options_.max_regions, " in all (unregister some)"));
    }
  }
  // Mapping touches the file system: outside the lock.
  absl::StatusOr<std::shared_ptr<MappedRegion>> mapped =
      MappedRegion::Map(options_.shm_dir, name, offset, size, owner.file_uids);
  if (!mapped.ok()) return mapped.status();
  RegionInfo info{0, name, offset, size};
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, created] = owners_.try_emplace(owner.key);
    if (created && owner.pid > 0) {
      it->second.pidfd = PidfdOpen(owner.pid);  // -1 (old kernel): not watched
      wake = it->second.pidfd >= 0;
    }
    info.region_id = next_id_++;
    it->second.regions.emplace(info.region_id, *std::move(mapped));
    ++count_;
    bytes_ += size;
  }
  if (wake) Wake();
  return info;
}

std::vector<RegionInfo> RegionTable::List(const RegionOwner& owner) const {
  std::vector<RegionInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owners_.find(owner.key);
  if (it == owners_.end()) return out;
  for (const auto& [id, region] : it->second.regions) {
    out.push_back({id, region->name(), region->offset(), region->size()});
  }
  return out;
}

absl::Status RegionTable::Unregister(const RegionOwner& owner, uint64_t region_id) {
  std::shared_ptr<MappedRegion> dropped;  // unmapped (if no job holds it) outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owners_.find(owner.key);
  if (it != owners_.end()) {
    auto region = it->second.regions.find(region_id);
    if (region != it->second.regions.end()) {
      dropped = std::move(region->second);
      it->second.regions.erase(region);
      --count_;
      bytes_ -= dropped->size();
      return absl::OkStatus();
    }
  }
  return FieldError(absl::StatusCode::kNotFound, {"region_id"},
                    absl::StrCat("region_id ", region_id, " is not a region of this client"));
}

absl::StatusOr<std::shared_ptr<MappedRegion>> RegionTable::Find(const std::string& owner_key,
                                                                uint64_t region_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owners_.find(owner_key);
  if (it != owners_.end()) {
    auto region = it->second.regions.find(region_id);
    if (region != it->second.regions.end()) return region->second;
  }
  return absl::NotFoundError(absl::StrCat("region ", region_id,
                                          " is not registered by this client (RegisterRegion "
                                          "first, on the same unix socket)"));
}

void RegionTable::DropOwner(const std::string& owner_key) {
  Owner dropped;  // its mappings go (unless jobs hold them) outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(owner_key);
    if (it == owners_.end()) return;
    dropped = std::move(it->second);
    owners_.erase(it);
    count_ -= dropped.regions.size();
    for (const auto& [id, region] : dropped.regions) bytes_ -= region->size();
  }
  if (dropped.pidfd >= 0) close(dropped.pidfd);
}

size_t RegionTable::regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

uint64_t RegionTable::registered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void RegionTable::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RegionTable::Watch() {
  while (true) {
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}};
    std::vector<std::string> keys = {""};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      for (const auto& [key, owner] : owners_) {
        if (owner.pidfd < 0) continue;
        fds.push_back({owner.pidfd, POLLIN, 0});
        keys.push_back(key);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) {
      uint64_t drained = 0;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) DropOwner(keys[i]);  // the owner process exited
    }
  }
}

}  // namespace centroidkv::service
