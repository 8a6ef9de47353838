// UnixServer and the region-versus-slabs comparison.
#include "tests/client/shm_testing.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "tests/client/client_testing.h"

namespace centroidkv::client::testutil {

UnixServer::UnixServer(const std::string& tag, const service::ServerOptions& options) {
  path = "/tmp/ckv-shm-" + tag + "-" + std::to_string(getpid()) + ".sock";
  std::filesystem::remove(path);
  service::ServerOptions defaults = TestServerOptions("unix://" + path);
  defaults.shared_memory = options.shared_memory;
  defaults.before_compute_for_testing = options.before_compute_for_testing;
  auto started = service::Server::Start(defaults);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return;
  server = *std::move(started);
  ClientOptions client_options;
  client_options.target = server->target();
  client_options.connect_timeout = std::chrono::seconds(5);
  auto connected = Client::Connect(client_options);
  EXPECT_TRUE(connected.ok()) << connected.status();
  if (connected.ok()) client = *std::move(connected);
}

UnixServer::~UnixServer() {
  client.reset();
  server.reset();
  std::filesystem::remove(path);
}

void ExpectSameAsSlabResult(const LayerResult& slab, const LayerResult& shm) {
  ASSERT_TRUE(slab.status.ok()) << slab.status;
  ASSERT_TRUE(shm.status.ok()) << shm.status;
  ASSERT_TRUE(shm.in_region.has_value());
  EXPECT_TRUE(shm.keys.empty());
  EXPECT_EQ(shm.dtype, slab.dtype);
  EXPECT_EQ(shm.offsets, slab.offsets);
  EXPECT_EQ(shm.passes_run, slab.passes_run);
  EXPECT_EQ(shm.head_entries, slab.head_entries);
  EXPECT_EQ(shm.stop_reasons, slab.stop_reasons);
  const LayerResult::RegionTensors& region = *shm.in_region;
  ASSERT_EQ(region.keys_bytes, slab.keys.size());
  ASSERT_EQ(region.values_bytes, slab.values.size());
  EXPECT_EQ(std::memcmp(region.keys, slab.keys.data(), slab.keys.size()), 0) << "keys differ";
  EXPECT_EQ(std::memcmp(region.values, slab.values.data(), slab.values.size()), 0)
      << "values differ";
  EXPECT_EQ(std::vector<uint32_t>(region.counts, region.counts + slab.counts.size()),
            slab.counts);
  ASSERT_EQ(region.assignment_elements, slab.assignment.size());
  EXPECT_EQ(std::vector<int32_t>(region.assignment,
                                 region.assignment + region.assignment_elements),
            slab.assignment);
}

}  // namespace centroidkv::client::testutil
