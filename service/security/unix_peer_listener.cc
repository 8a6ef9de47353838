// UnixPeerListener: bind, accept, SO_PEERCRED check, hand-off to gRPC.
#include "service/security/unix_peer_listener.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace centroidkv::service {

absl::StatusOr<std::unique_ptr<UnixPeerListener>> UnixPeerListener::Start(
    const std::string& path, const std::vector<uint32_t>& allowed_uids, grpc::Server* server,
    std::function<void(uint32_t)> on_refused) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: unix socket path '", path, "' is empty or too long"));
  }
  std::unique_ptr<UnixPeerListener> listener(new UnixPeerListener());
  listener->path_ = path;
  listener->allowed_.insert(allowed_uids.begin(), allowed_uids.end());
  listener->server_ = server;
  listener->on_refused_ = std::move(on_refused);
  // A socket file left by an earlier run would make bind fail; anything else is an error.
  struct stat existing {};
  if (lstat(path.c_str(), &existing) == 0 && S_ISSOCK(existing.st_mode)) unlink(path.c_str());
  listener->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener->listen_fd_ < 0) {
    return absl::InternalError(absl::StrCat("listen: socket(): ", std::strerror(errno)));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (bind(listener->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener->listen_fd_, 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot listen on 'unix://", path, "': ", std::strerror(errno)));
  }
  if (pipe2(listener->wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("listen: pipe2(): ", std::strerror(errno)));
  }
  listener->thread_ = std::thread([raw = listener.get()] { raw->AcceptLoop(); });
  return listener;
}

UnixPeerListener::~UnixPeerListener() {
  Stop();
  for (int fd : wake_fds_) {
    if (fd >= 0) close(fd);
  }
}

void UnixPeerListener::Stop() {
  std::call_once(stop_once_, [this] {
    if (thread_.joinable()) {
      const char byte = 1;
      (void)!write(wake_fds_[1], &byte, 1);
      thread_.join();
    }
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      unlink(path_.c_str());
    }
  });
}

void UnixPeerListener::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) Accept();
  }
}

void UnixPeerListener::Accept() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN: nothing more to accept now (or a transient error)
    ucred peer{};
    socklen_t size = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 ||
        (!allowed_.empty() && allowed_.count(peer.uid) == 0)) {
      close(fd);  // the client sees the connection closed: UNAVAILABLE
      if (on_refused_) on_refused_(peer.uid);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer_by_fd_[fd] = PeerCredentials{peer.uid, peer.gid, peer.pid};
    }
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the fd from here
  }
}

std::optional<uint32_t> UnixPeerListener::UidOfPeer(const std::string& peer) const {
  std::optional<PeerCredentials> credentials = CredentialsOfPeer(peer);
  if (!credentials.has_value()) return std::nullopt;
  return credentials->uid;
}

std::optional<PeerCredentials> UnixPeerListener::CredentialsOfPeer(
    const std::string& peer) const {
  absl::string_view rest(peer);
  int fd = -1;
  if (!absl::ConsumePrefix(&rest, "fd:") || !absl::SimpleAtoi(rest, &fd)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peer_by_fd_.find(fd);
  if (it == peer_by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace centroidkv::service
