// Shared memory end to end: a real server on a unix socket and the C++ client's
// ShmRegion / ShmLayerStack (client/shm_region.cc) against it. Every golden case by
// reference equals the slab path bit for bit; streams with their own regions at once;
// bounds (out of range, too small, overlapping output) as JobErrors naming the field; a
// region unregistered while its job runs; another uid's file refused; shm on TCP refused.
// The client process that dies holding regions is tests/service/shm/region_owner_test.cc; a
// region file truncated under a job is shm_truncation_test.cc.
#include "centroidkv/client/shm_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <filesystem>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/client/shm_testing.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using testutil::ExpectSameAsSlabResult;
using testutil::UnixServer;

// ---------------------------------------------------------------------------------------
// Golden cases: by reference == slabs, bit for bit.

class GoldenShmTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenShmTest, ByReferenceEqualsSlabPath) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(GetParam());
  ASSERT_TRUE(golden.ok()) << golden.status();
  UnixServer unix_server("golden");
  ASSERT_NE(unix_server.client, nullptr);
  absl::StatusOr<ServerInfo> info = unix_server.client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->shared_memory);
  for (DType output : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(std::string("output ") + (output == DType::kFloat32 ? "float32" : "float16"));
    LayerJob job = testutil::GoldenJob(*golden);
    job.output_dtype = output;
    absl::StatusOr<std::vector<LayerResult>> slab = unix_server.client->CompressLayers({job});
    ASSERT_TRUE(slab.ok()) << slab.status();

    absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack = ShmLayerStack::Create(
        unix_server.client.get(), job.layer, 1, job.options, job.output_dtype);
    ASSERT_TRUE(stack.ok()) << stack.status();
    (*stack)->Fill(0, job.layer);
    // The cpu backend writes the rows straight into the region (unless a stage above it
    // reshapes them); the reference backend's rows are copied there. Both equal the slabs.
    const service::ServiceMetrics& metrics = unix_server.server->context().metrics;
    const CompressOptions& options = golden->options;
    const bool reshaped = options.pad_heads || options.pad_to > 0 || options.exact_target ||
                          options.output_layout == TensorLayout::kTokenMajor;
    for (BackendKind backend : {BackendKind::kCpu, BackendKind::kReference}) {
      SCOPED_TRACE(std::string(BackendKindName(backend)));
      const int64_t in_place = metrics.region_results(true);
      const int64_t copied = metrics.region_results(false);
      LayerJob by_reference = (*stack)->Job(0);
      by_reference.backend = backend;
      absl::StatusOr<std::vector<LayerResult>> shm =
          unix_server.client->CompressLayers({by_reference});
      ASSERT_TRUE(shm.ok()) << shm.status();
      ExpectSameAsSlabResult((*slab)[0], (*shm)[0]);
      const bool expect_in_place = backend == BackendKind::kCpu && !reshaped;
      EXPECT_EQ(metrics.region_results(true) - in_place, expect_in_place ? 1 : 0);
      EXPECT_EQ(metrics.region_results(false) - copied, expect_in_place ? 0 : 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenShmTest, ::testing::ValuesIn(test::ListGoldenCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return testutil::CamelCase(info.param);
                         });

// ---------------------------------------------------------------------------------------
// Many streams, each with its own regions, at once.

TEST(ShmRegionTest, ManyStreamsWithTheirOwnRegionsAtOnce) {
  UnixServer unix_server("streams");
  ASSERT_NE(unix_server.client, nullptr);
  constexpr int kStreams = 4;
  constexpr int kLayers = 3;
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      const DType dtype = s % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
      std::vector<test::RandomLayer> layers;
      for (int l = 0; l < kLayers; ++l) {
        test::RandomLayerSpec spec = test::Spec(4, 96 + 32 * s, 32, 16, 100 * s + l, dtype);
        spec.with_counts = s == 1;
        spec.prototypes = 6;
        layers.push_back(test::RandomLayer::Generate(spec));
      }
      CompressOptions options;
      options.compute_assignment = s != 2;
      absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack = ShmLayerStack::Create(
          unix_server.client.get(), layers[0].view(), kLayers, options);
      ASSERT_TRUE(stack.ok()) << stack.status();
      std::unique_ptr<CompressStream> stream = unix_server.client->OpenStream();
      std::vector<uint64_t> ids;
      for (int l = 0; l < kLayers; ++l) {
        (*stack)->Fill(l, layers[l].view());
        absl::StatusOr<uint64_t> id = stream->Submit((*stack)->Job(l));
        ASSERT_TRUE(id.ok()) << id.status();
        ids.push_back(*id);
      }
      for (int received = 0; received < kLayers; ++received) {
        absl::StatusOr<LayerResult> result = stream->Next();
        ASSERT_TRUE(result.ok()) << result.status();
        const int l = static_cast<int>(result->job_id - ids[0]);
        ASSERT_GE(l, 0);
        ASSERT_LT(l, kLayers);
        LayerJob slab_job;
        slab_job.layer = layers[l].view();
        slab_job.options = options;
        absl::StatusOr<std::vector<LayerResult>> slab =
            unix_server.client->CompressLayers({slab_job});
        ASSERT_TRUE(slab.ok()) << slab.status();
        ExpectSameAsSlabResult((*slab)[0], *result);
      }
      EXPECT_TRUE(stream->Close().ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Every region went with its stack.
  absl::StatusOr<std::vector<Client::Region>> left = unix_server.client->ListRegions();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty());
  EXPECT_EQ(unix_server.server->context().regions.regions(), 0u);
}

// ---------------------------------------------------------------------------------------
// Bounds: each a JobError naming the field; the stream goes on.

TEST(ShmRegionTest, BadSpansAreJobErrorsNamingTheField) {
  UnixServer unix_server("bounds");
  ASSERT_NE(unix_server.client, nullptr);
  const test::RandomLayer layer = test::RandomLayer::Generate(test::Spec(2, 64, 16, 16, 7));
  CompressOptions options;
  absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack =
      ShmLayerStack::Create(unix_server.client.get(), layer.view(), 1, options);
  ASSERT_TRUE(stack.ok()) << stack.status();
  (*stack)->Fill(0, layer.view());
  const LayerJob good = (*stack)->Job(0);
  const uint64_t region_size = (*stack)->region().size();

  struct Case {
    const char* what;
    std::function<void(LayerJob*)> edit;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"output past the region's end",
       [&](LayerJob* job) { job->shm_output->keys_offset = region_size; },
       absl::StatusCode::kOutOfRange, "start_job.region_output.out_keys.offset"},
      {"output span too small",
       [](LayerJob* job) { job->shm_output->values_bytes -= 4; },
       absl::StatusCode::kInvalidArgument, "start_job.region_output.out_values.bytes"},
      {"output over the input",
       [&](LayerJob* job) {
         job->shm_output->counts_offset =
             *(*stack)->region().OffsetOf(job->layer.keys, 4);  // inside the keys
       },
       absl::StatusCode::kInvalidArgument, "start_job.region_output.out_counts"},
      {"misaligned output",
       [](LayerJob* job) { job->shm_output->keys_offset += 2; },
       absl::StatusCode::kInvalidArgument, "start_job.region_output.out_keys.offset"},
  };
  std::unique_ptr<CompressStream> stream = unix_server.client->OpenStream();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    LayerJob job = good;
    c.edit(&job);
    ASSERT_TRUE(stream->Submit(job).ok());
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->status.code(), c.code) << result->status;
    std::optional<FieldLocation> location = GetFieldLocation(result->status);
    ASSERT_TRUE(location.has_value()) << result->status;
    EXPECT_EQ(location->field, c.field) << result->status;
  }
  // The stream goes on: the good job still runs.
  ASSERT_TRUE(stream->Submit(good).ok());
  absl::StatusOr<LayerResult> result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->status.ok()) << result->status;
  EXPECT_TRUE(result->in_region.has_value());
  EXPECT_TRUE(stream->Close().ok());
}

// A region unregistered while its job runs: the job finishes (its mapping is held) and
// later jobs naming it fail with NOT_FOUND naming the region id.
TEST(ShmRegionTest, RegionUnregisteredMidJobStaysMappedUntilTheJobEnds) {
  UnixServer unix_server("unregister");
  ASSERT_NE(unix_server.client, nullptr);
  // The reference backend at this size takes a good fraction of a second.
  const test::RandomLayer layer = test::RandomLayer::Generate(test::Spec(4, 1024, 64, 64, 9));
  CompressOptions options;
  options.compute_assignment = true;
  absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack =
      ShmLayerStack::Create(unix_server.client.get(), layer.view(), 1, options);
  ASSERT_TRUE(stack.ok()) << stack.status();
  (*stack)->Fill(0, layer.view());
  LayerJob job = (*stack)->Job(0);
  job.backend = BackendKind::kReference;
  // /metrics counts the region (its bytes are the client's, outside every budget).
  const std::string before = unix_server.server->context().metrics.Render();
  EXPECT_NE(before.find("centroidkv_shm_regions 1\n"), std::string::npos) << before;
  EXPECT_NE(before.find("centroidkv_shm_registered_bytes " +
                        std::to_string((*stack)->region().size()) + "\n"),
            std::string::npos)
      << before;
  std::unique_ptr<CompressStream> stream = unix_server.client->OpenStream();
  ASSERT_TRUE(stream->Submit(job).ok());
  // Wait until the job is computing, then unregister its region.
  const service::ServiceMetrics& counters = unix_server.server->context().metrics;
  for (int i = 0; i < 500 && counters.jobs_received() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(unix_server.client->UnregisterRegion((*stack)->region().region_id()).ok());
  EXPECT_EQ(unix_server.server->context().regions.regions(), 0u);
  const std::string after = unix_server.server->context().metrics.Render();
  EXPECT_NE(after.find("centroidkv_shm_regions 0\n"), std::string::npos) << after;
  absl::StatusOr<LayerResult> result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->status.ok()) << result->status;
  LayerJob slab_job;
  slab_job.layer = layer.view();
  slab_job.options = options;
  slab_job.backend = BackendKind::kReference;
  absl::StatusOr<std::vector<LayerResult>> slab = unix_server.client->CompressLayers({slab_job});
  ASSERT_TRUE(slab.ok()) << slab.status();
  ExpectSameAsSlabResult((*slab)[0], *result);
  // Named again: the region is gone.
  ASSERT_TRUE(stream->Submit(job).ok());
  result = stream->Next();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status.code(), absl::StatusCode::kNotFound) << result->status;
  std::optional<FieldLocation> location = GetFieldLocation(result->status);
  ASSERT_TRUE(location.has_value());
  EXPECT_EQ(location->field, "start_job.region_input.keys.region_id");
  EXPECT_TRUE(stream->Close().ok());
}

// A file under /dev/shm of another uid is refused; allowlisting that uid admits it.
TEST(ShmRegionTest, AnotherUidsFileIsRefusedUnlessAllowlisted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to another uid";
  constexpr uid_t kOtherUid = 4242;
  const std::string name = "/ckv-other-uid-" + std::to_string(getpid());
  const std::string path = "/dev/shm" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  ASSERT_EQ(fchown(fd, kOtherUid, kOtherUid), 0) << std::strerror(errno);
  close(fd);
  {
    UnixServer unix_server("uid");
    ASSERT_NE(unix_server.client, nullptr);
    absl::StatusOr<Client::Region> refused = unix_server.client->RegisterRegion(name, 0, 1 << 16);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
    EXPECT_NE(refused.status().message().find("uid 4242"), absl::string_view::npos)
        << refused.status();
  }
  {
    service::ServerOptions options;
    options.shared_memory.owner_uids = {kOtherUid};
    UnixServer unix_server("uid-allowed", options);
    ASSERT_NE(unix_server.client, nullptr);
    absl::StatusOr<Client::Region> admitted =
        unix_server.client->RegisterRegion(name, 0, 1 << 16);
    EXPECT_TRUE(admitted.ok()) << admitted.status();
    absl::StatusOr<std::vector<Client::Region>> listed = unix_server.client->ListRegions();
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].name, name);
    // Too large for the file: refused naming size.
    absl::StatusOr<Client::Region> too_big =
        unix_server.client->RegisterRegion(name, 0, 1 << 20);
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();
  }
  unlink(path.c_str());
}

// A client may write its region while the server reads it (a bug, or on purpose): input
// rows that turn NaN, Inf or huge between the engine's check and its later passes must
// fail or spoil that job only, never crash the server or break the stream. Several streams
// submit multi-pass jobs by reference while a thread scribbles over their input slots; then
// a clean job on the same region equals the slab path bit for bit.
TEST(ShmRegionTest, InputScribbledDuringJobsNeverCrashesTheServer) {
  UnixServer unix_server("scribble");
  ASSERT_NE(unix_server.client, nullptr);
  test::RandomLayerSpec spec = test::Spec(4, 768, 64, 64, 77);
  spec.prototypes = 24;
  const test::RandomLayer layer = test::RandomLayer::Generate(spec);
  CompressOptions options;
  options.target_ratio = 0.1;  // several passes, each reading the unmerged rows again
  options.chunk_size = 64;
  options.compute_assignment = true;
  constexpr int kStreams = 3;
  absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack = ShmLayerStack::Create(
      unix_server.client.get(), layer.view(), kStreams, options, DType::kFloat16, kStreams);
  ASSERT_TRUE(stack.ok()) << stack.status();
  for (int s = 0; s < kStreams; ++s) (*stack)->Fill(s, layer.view());
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937_64 random(5);
    const size_t elements = size_t{4} * 768 * 64;
    const float poison[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), -3e38f, 1e-40f, 0.0f};
    while (!stop.load()) {
      // Clean rows for a while (jobs pass the engine's check), then poison under them.
      for (int s = 0; s < kStreams; ++s) (*stack)->Fill(s, layer.view());
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 20000));
      for (int s = 0; s < kStreams; ++s) {
        auto* keys = static_cast<float*>((*stack)->keys(s));
        auto* values = static_cast<float*>((*stack)->values(s));
        for (int k = 0; k < 64; ++k) {
          const float bad = poison[random() % std::size(poison)];
          const size_t at = random() % elements;
          (random() % 2 == 0 ? keys : values)[at] = bad;
          if (random() % 4 == 0) {  // random bits too
            const uint32_t bits = static_cast<uint32_t>(random());
            std::memcpy(&keys[random() % elements], &bits, sizeof(bits));
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 5000));
    }
  });
  std::vector<std::thread> streams;
  std::atomic<int> answered{0}, failed{0};
  for (int s = 0; s < kStreams; ++s) {
    streams.emplace_back([&, s] {
      std::unique_ptr<CompressStream> stream = unix_server.client->OpenStream();
      for (int job = 0; job < 40; ++job) {
        absl::StatusOr<uint64_t> id = stream->Submit((*stack)->Job(s, s));
        ASSERT_TRUE(id.ok()) << id.status();
        absl::StatusOr<LayerResult> result = stream->Next();
        ASSERT_TRUE(result.ok()) << "the stream broke: " << result.status();
        answered.fetch_add(1);
        if (!result->status.ok()) {
          failed.fetch_add(1);
          // A bad row seen by the engine's check (INVALID_ARGUMENT naming it), one that was
          // gone again when the engine looked for it (ABORTED), or a spoilt result too large
          // for fp16 (OUT_OF_RANGE).
          const absl::StatusCode code = result->status.code();
          EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
                      code == absl::StatusCode::kAborted || code == absl::StatusCode::kOutOfRange)
              << result->status;
        }
      }
      EXPECT_TRUE(stream->Close().ok());
    });
  }
  for (std::thread& stream : streams) stream.join();
  stop.store(true);
  scribbler.join();
  EXPECT_EQ(answered.load(), kStreams * 40);
  // The server still serves: a clean job by reference equals the slab path.
  (*stack)->Fill(0, layer.view());
  LayerJob slab_job;
  slab_job.layer = layer.view();
  slab_job.options = options;
  slab_job.output_dtype = DType::kFloat16;
  absl::StatusOr<std::vector<LayerResult>> slab = unix_server.client->CompressLayers({slab_job});
  ASSERT_TRUE(slab.ok()) << slab.status();
  absl::StatusOr<std::vector<LayerResult>> shm =
      unix_server.client->CompressLayers({(*stack)->Job(0, 0)});
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE((*shm)[0].status.ok()) << (*shm)[0].status;
  ExpectSameAsSlabResult((*slab)[0], (*shm)[0]);
  std::cout << "scribbled jobs: " << answered.load() << " answered, " << failed.load()
            << " with a JobError\n";
}

// On TCP, shared memory is refused with a status that says why; GetInfo says it is off.
TEST(ShmRegionTest, TcpListenerRefusesRegions) {
  auto server = service::Server::Start(testutil::TestServerOptions("127.0.0.1:0"));
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->target();
  options.connect_timeout = std::chrono::seconds(5);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<ServerInfo> info = (*client)->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->shared_memory);
  absl::StatusOr<std::unique_ptr<ShmRegion>> region = ShmRegion::Create(client->get(), 1 << 16);
  ASSERT_FALSE(region.ok());
  EXPECT_EQ(region.status().code(), absl::StatusCode::kFailedPrecondition) << region.status();
  EXPECT_NE(region.status().message().find("unix socket"), absl::string_view::npos)
      << region.status();
  // Nothing is left behind in /dev/shm by the failed attempt: the region's destructor ran.
}

}  // namespace
}  // namespace centroidkv::client
