// The shared memory regions registered with this server, by owner. An owner is the client
// process on the other end of the unix socket (SO_PEERCRED pid), or, where the server
// cannot see the peer's pid (another pid namespace, or TCP with --shared-memory-over-tcp),
// the caller identity. A region is visible only to its owner (its own streams name it in
// jobs), is unmapped when the owner unregisters it, and when an owner process exits (a
// thread watches each owner's pidfd) all its regions go at once. A job that still uses a
// region keeps its mapping alive (MappedRegion is shared). Regions count against the
// server's memory only as metadata: at most max_regions_per_owner per owner and
// max_regions in all. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "service/security/unix_peer_listener.h"
#include "service/server_options.h"
#include "service/shm/mapped_region.h"

namespace centroidkv::service {

// Who owns regions registered on one call or named by one stream.
struct RegionOwner {
  std::string key;                 // "pid:1234" or "caller:<identity>"
  int32_t pid = 0;                 // watched for exit when > 0
  std::vector<uint32_t> file_uids;  // whose files it may register
};

struct RegionInfo {
  uint64_t region_id = 0;
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
};

class RegionTable {
 public:
  explicit RegionTable(const SharedMemoryOptions& options);
  ~RegionTable();  // joins the watcher; mappings still used by jobs stay until they end

  // The peer lookup of the unix listener (null: no unix peers are known, i.e. TCP).
  void SetPeerLookup(std::function<std::optional<PeerCredentials>(const std::string&)> lookup);

  // The owner of a call from gRPC peer `peer` by `caller`, or FAILED_PRECONDITION saying why
  // this connection gets no shared memory (off, or not a unix socket peer).
  absl::StatusOr<RegionOwner> OwnerOf(const std::string& peer, const std::string& caller) const;

  absl::StatusOr<RegionInfo> Register(const RegionOwner& owner, const std::string& name,
                                      uint64_t offset, uint64_t size);
  std::vector<RegionInfo> List(const RegionOwner& owner) const;
  // NOT_FOUND (field region_id) when the owner has no such region.
  absl::Status Unregister(const RegionOwner& owner, uint64_t region_id);
  // The mapping of one of the owner's regions, for a job; NOT_FOUND otherwise.
  absl::StatusOr<std::shared_ptr<MappedRegion>> Find(const std::string& owner_key,
                                                     uint64_t region_id) const;
  // Forgets every region of the owner (its process exited).
  void DropOwner(const std::string& owner_key);

  size_t regions() const;
  uint64_t registered_bytes() const;  // bytes of the regions registered (mapped, not owned)

 private:
  struct Owner {
    int pidfd = -1;  // readable once the process exits; -1: not watched
    std::map<uint64_t, std::shared_ptr<MappedRegion>> regions;
  };
  void Watch();
  void Wake();

  const SharedMemoryOptions options_;
  mutable std::mutex mu_;
  std::function<std::optional<PeerCredentials>(const std::string&)> peer_lookup_;
  std::map<std::string, Owner> owners_;
  uint64_t next_id_ = 1;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
  int wake_fd_ = -1;  // an eventfd: the owner set changed, or stop
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace centroidkv::service
