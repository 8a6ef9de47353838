// Shared support of the shared memory tests (shm_region_test.cc, shm_truncation_test.cc): a
// real in-process server on its own unix socket with a client of it, and the comparison of a
// result written to a region with the slab path's.
// Thread-compatible: one UnixServer per test; the comparison may run on several threads.
#pragma once

#include <memory>
#include <string>

#include "centroidkv/client/client.h"
#include "service/server.h"

namespace centroidkv::client::testutil {

// A server on unix socket /tmp/ckv-shm-TAG-PID.sock (TestServerOptions, with `options`'
// shared_memory and before_compute_for_testing), and a client of it; EXPECTs both start.
struct UnixServer {
  explicit UnixServer(const std::string& tag, const service::ServerOptions& options = {});
  ~UnixServer();
  std::string path;
  std::unique_ptr<service::Server> server;
  std::unique_ptr<Client> client;
};

// EXPECTs that a result written to shared memory equals the slab path's, bit for bit.
void ExpectSameAsSlabResult(const LayerResult& slab, const LayerResult& shm);

}  // namespace centroidkv::client::testutil
