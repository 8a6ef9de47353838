// Shared support of the client tests: a real in-process Server per test suite (loopback,
// port 0), the in-process reference engine the results are compared with, and comparisons
// of a client LayerResult with an engine CompressResult.
// Thread-safety: the comparisons may be called from several threads (GoogleTest EXPECTs
// are thread-safe with pthreads); the fixture is set up once per suite.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "centroidkv/client/client.h"
#include "centroidkv/kernels/engine.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client::testutil {

// Limits the test server is started with; GetInfo must report these, not the defaults.
inline constexpr uint64_t kTestMaxJobBytes = uint64_t{48} << 20;
inline constexpr uint64_t kTestMaxStreamBytes = uint64_t{96} << 20;

// Options of every test server: small pool, distinctive limits, short grace period.
service::ServerOptions TestServerOptions(const std::string& listen_address);

// The in-process reference engine (created once).
const ClusterEngine& ReferenceEngine();

// Runs `job` on ReferenceEngine(); EXPECTs success.
CompressResult EngineResult(const LayerJob& job);

// The client's result as an engine result (keys and values widened to float32).
CompressResult AsEngineResult(const LayerResult& result);

// EXPECTs that a server result is `expected` rounded once to `dtype`: status OK, shape
// fields, offsets, counts, assignment and passes exactly, keys and values bit for bit.
void ExpectSameAsEngine(const CompressResult& expected, DType dtype, const LayerResult& actual);

// A golden case's layer as a job on the cpu backend: its options, the assignment asked for,
// float32 rows (comparable with test::ExpectMatchesGolden). Borrows `golden`'s buffers.
LayerJob GoldenJob(const test::GoldenCase& golden);

// "small_basic" -> "SmallBasic", for test names without underscores.
std::string CamelCase(const std::string& name);

// Owned random layers and the jobs over them. Job i is varied in shape, dtype, layout,
// counts and every parameter, deterministically from i and the seed base; layer_index is
// first_layer_index + i, backend reference, output float32 except every fourth job (input
// dtype).
struct JobSet {
  std::vector<test::RandomLayerSpec> specs;
  std::vector<test::RandomLayer> layers;
  std::vector<LayerJob> jobs;
};
JobSet MakeVariedJobs(int count, uint64_t seed_base, uint32_t first_layer_index);

// Submits every job before reading any result, then reads them all: EXPECTs each job's
// result exactly once (ids distinct, none unknown), backend "reference", equal to the
// engine's; then OutOfRange, then a clean Close. `after_result(n)`, if given, runs after
// the n-th result (n from 1), e.g. to stop a replica mid-run.
void RunPipelined(CompressStream* stream, const std::vector<LayerJob>& jobs,
                  const std::vector<test::RandomLayerSpec>& specs,
                  const std::function<void(size_t)>& after_result = nullptr);

// A loopback port nothing listens on (bound, read, then closed); 0 on failure.
int UnusedPort();

// A fixture whose suite shares one Server on 127.0.0.1:0.
class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;

  // Options aimed at the suite's server (connect timeout 5 s).
  static ClientOptions Options();
  // Client::Connect(options); EXPECTs success (null on failure).
  static std::unique_ptr<Client> Connect(const ClientOptions& options);
  static std::unique_ptr<Client> Connect() { return Connect(Options()); }

  static service::Server* server_;
};

}  // namespace centroidkv::client::testutil
