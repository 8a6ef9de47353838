// CheckUnixPathNotServed: connect(2) to the path; accepted = a live server holds it.
#include "service/listen_address.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace centroidkv::service {

absl::Status CheckUnixPathNotServed(const std::string& listen_address) {
  std::string path;
  if (absl::StartsWith(listen_address, "unix://")) {
    path = listen_address.substr(7);
  } else if (absl::StartsWith(listen_address, "unix:")) {
    path = listen_address.substr(5);
  } else {
    return absl::OkStatus();
  }
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof(address.sun_path)) return absl::OkStatus();
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();  // cannot tell; gRPC's bind decides
  const bool served =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  if (served) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen: unix socket '", path, "' is held by a running server; stop it or pick "
        "another --listen path"));
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::service
