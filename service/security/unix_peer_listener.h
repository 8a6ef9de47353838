// The unix socket listener for --allow-uids and shared memory: gRPC does not expose a peer's
// credentials, so the server accepts on the socket itself, reads each peer's credentials
// (SO_PEERCRED), closes the connection at once when the uid is not allowed, and hands every
// other connection to gRPC (grpc::AddInsecureChannelFromFd), where it is served like any
// other. gRPC names those peers "fd:N"; UidOfPeer / CredentialsOfPeer map that name back,
// for caller identities and for the owners of shared memory regions.
// Thread-safe; one accept thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace centroidkv::service {

// What SO_PEERCRED says about a connected process. pid is 0 when the peer lives in a pid
// namespace the server cannot see (another container without a shared process namespace).
struct PeerCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;
};

class UnixPeerListener {
 public:
  // Binds `path` (replacing a stale socket file), listens, and starts accepting for
  // `server`, which must be started and outlive Stop(). `on_refused` is called (on the
  // accept thread) with each refused uid.
  static absl::StatusOr<std::unique_ptr<UnixPeerListener>> Start(
      const std::string& path, const std::vector<uint32_t>& allowed_uids, grpc::Server* server,
      std::function<void(uint32_t)> on_refused);
  ~UnixPeerListener();

  // Stops accepting and closes the listening socket (connections already handed to gRPC
  // stay with gRPC). Idempotent.
  void Stop();
  // The uid of a peer gRPC calls `peer` ("fd:N"), if this listener accepted it.
  std::optional<uint32_t> UidOfPeer(const std::string& peer) const;
  std::optional<PeerCredentials> CredentialsOfPeer(const std::string& peer) const;

 private:
  UnixPeerListener() = default;
  void AcceptLoop();
  void Accept();

  std::string path_;
  std::set<uint32_t> allowed_;
  grpc::Server* server_ = nullptr;
  std::function<void(uint32_t)> on_refused_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: Stop() writes to end the poll
  std::thread thread_;
  std::once_flag stop_once_;
  mutable std::mutex mu_;
  std::map<int, PeerCredentials> peer_by_fd_;  // accepted fds; a reused fd number overwrites
};

}  // namespace centroidkv::service
