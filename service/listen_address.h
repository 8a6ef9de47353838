// Checks that the server's listening address is not another live server's. gRPC unlinks
// an existing unix socket file before binding it, so a second server on the same path
// would silently take it over (the first one orphaned, still running); this refuses
// instead. A stale socket file (nobody accepting on it) is left for gRPC to replace.
// (TCP needs no check here: the server sets GRPC_ARG_ALLOW_REUSEPORT = 0, so a bound port
// makes the bind fail.)
// Thread-compatible: a pure function (it connects to the path once).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace centroidkv::service {

// OK for TCP addresses, a free unix path or a stale socket file; FAILED_PRECONDITION
// naming the path when a process accepts connections on it.
absl::Status CheckUnixPathNotServed(const std::string& listen_address);

}  // namespace centroidkv::service
