// A client that truncates its region's file under a job (service/shm/sigbus_guard.h,
// service/shm/job_regions.h), against a real server on a unix socket: the server does not die
// of SIGBUS. Truncated while the job runs (ServerOptions::before_compute_for_testing cuts the
// file on the worker thread just before the engine reads it: deterministic), the job fails
// with DATA_LOSS naming the span the fault hit, on the input or on the output; the region
// stays unusable (FAILED_PRECONDITION) even after the file grows back, and unregisters; jobs
// of another stream on another region meanwhile equal the slab path bit for bit, and a golden
// job afterwards is right. Truncated before the job starts: a cheap FAILED_PRECONDITION from
// fstat, and the region works again once the file is whole.
#include <unistd.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "centroidkv/client/shm_region.h"
#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "tests/client/client_testing.h"
#include "tests/client/shm_testing.h"
#include "tests/testing/golden.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using testutil::ExpectSameAsSlabResult;
using testutil::UnixServer;

constexpr uint32_t kVictimLayer = 7;  // the layer index of the job whose file is cut
const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

uint64_t RoundUpToPage(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// What the server's test hook does: once armed, before the engine runs the victim job, it
// truncates a file (as the region's owner would, from another thread of its own).
struct Truncation {
  void Arm(const std::string& shm_name, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    path = "/dev/shm" + shm_name;
    new_size = bytes;
    armed = true;
  }
  void BeforeCompute(uint32_t layer_index) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || layer_index != kVictimLayer) return;
    armed = false;
    EXPECT_EQ(truncate(path.c_str(), static_cast<off_t>(new_size)), 0) << path;
    ++done;
  }
  int times() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  std::mutex mu;
  std::string path;
  uint64_t new_size = 0;
  bool armed = false;
  int done = 0;
};

// 4 heads x 2048 tokens x 64 float32: 2 MiB of keys, 2 MiB of values (hundreds of pages).
test::RandomLayer BigLayer(uint64_t seed) {
  test::RandomLayerSpec spec = test::Spec(4, 2048, 64, 64, seed);
  spec.prototypes = 12;
  return test::RandomLayer::Generate(spec);
}

class ShmTruncationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service::ServerOptions options;
    options.before_compute_for_testing = [this](uint32_t layer) {
      truncation_.BeforeCompute(layer);
    };
    server_.emplace(::testing::UnitTest::GetInstance()->current_test_info()->name(), options);
    ASSERT_NE(server_->client, nullptr);
    options_.compute_assignment = true;
  }

  Client& client() { return *server_->client; }

  // A region laid out for `layer` (one slot), filled; its job on the cpu backend.
  std::unique_ptr<ShmLayerStack> MakeStack(const test::RandomLayer& layer) {
    absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack =
        ShmLayerStack::Create(&client(), layer.view(), 1, options_);
    EXPECT_TRUE(stack.ok()) << stack.status();
    if (!stack.ok()) return nullptr;
    (*stack)->Fill(0, layer.view());
    return *std::move(stack);
  }
  // The victim: a big layer in a region of its own, and its job (layer kVictimLayer).
  void MakeVictim(uint64_t seed) {
    victim_layer_.emplace(BigLayer(seed));
    victim_ = MakeStack(*victim_layer_);
    ASSERT_NE(victim_, nullptr);
    victim_job_ = victim_->Job(0);
    victim_job_.layer_index = kVictimLayer;
    victim_job_.backend = BackendKind::kCpu;
  }
  std::string VictimPath() const { return "/dev/shm" + victim_->region().name(); }
  LayerResult SlabResult(const test::RandomLayer& layer) {
    LayerJob job;
    job.layer = layer.view();
    job.options = options_;
    job.backend = BackendKind::kCpu;
    absl::StatusOr<std::vector<LayerResult>> slab = client().CompressLayers({job});
    EXPECT_TRUE(slab.ok()) << slab.status();
    return slab.ok() ? (*slab)[0] : LayerResult{};
  }
  LayerResult RunOne(const LayerJob& job) {
    absl::StatusOr<std::vector<LayerResult>> results = client().CompressLayers({job});
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? (*results)[0] : LayerResult{};
  }

  // EXPECTs a JobError of `code` located at `field` whose message says `says`.
  static void ExpectJobError(const LayerResult& result, absl::StatusCode code,
                             const std::string& field, const std::string& says) {
    EXPECT_EQ(result.status.code(), code) << result.status;
    std::optional<FieldLocation> location = GetFieldLocation(result.status);
    ASSERT_TRUE(location.has_value()) << result.status;
    EXPECT_EQ(location->field, field) << result.status;
    EXPECT_NE(result.status.message().find(says), absl::string_view::npos) << result.status;
  }

  // The server still answers: a golden case through slabs and through a fresh region.
  void ExpectGoldenStillRight() {
    const std::vector<std::string> cases = test::ListGoldenCases();
    ASSERT_FALSE(cases.empty());
    absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(cases[0]);
    ASSERT_TRUE(golden.ok()) << golden.status();
    const LayerJob job = testutil::GoldenJob(*golden);
    const LayerResult slab = RunOne(job);
    ASSERT_TRUE(slab.status.ok()) << slab.status;
    test::ExpectMatchesGolden(*golden, testutil::AsEngineResult(slab));
    absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack =
        ShmLayerStack::Create(&client(), job.layer, 1, job.options, job.output_dtype);
    ASSERT_TRUE(stack.ok()) << stack.status();
    (*stack)->Fill(0, job.layer);
    LayerJob by_reference = (*stack)->Job(0);
    by_reference.backend = BackendKind::kCpu;
    ExpectSameAsSlabResult(slab, RunOne(by_reference));
  }

  CompressOptions options_;
  Truncation truncation_;
  std::optional<UnixServer> server_;
  std::optional<test::RandomLayer> victim_layer_;
  std::unique_ptr<ShmLayerStack> victim_;
  LayerJob victim_job_;
};

TEST_F(ShmTruncationTest, InputTruncatedMidJobFailsOnlyThatJob) {
  ASSERT_NO_FATAL_FAILURE(MakeVictim(1));
  // Another stream on another region, its jobs in flight while the victim's file is cut.
  std::vector<test::RandomLayer> other_layers;
  for (uint64_t seed : {11, 12, 13}) other_layers.push_back(BigLayer(seed));
  absl::StatusOr<std::unique_ptr<ShmLayerStack>> other =
      ShmLayerStack::Create(&client(), other_layers[0].view(), 3, options_);
  ASSERT_TRUE(other.ok()) << other.status();
  std::unique_ptr<CompressStream> other_stream = client().OpenStream();
  for (int32_t l = 0; l < 3; ++l) {
    (*other)->Fill(l, other_layers[l].view());
    LayerJob job = (*other)->Job(l);
    job.backend = BackendKind::kCpu;
    ASSERT_TRUE(other_stream->Submit(job).ok());
  }

  // Cut the victim's file just past its keys: the engine's reads of the values fault.
  const uint64_t values_at = *victim_->region().OffsetOf(victim_job_.layer.values, 0);
  truncation_.Arm(victim_->region().name(), RoundUpToPage(values_at));
  const LayerResult failed = RunOne(victim_job_);
  EXPECT_EQ(truncation_.times(), 1);
  ExpectJobError(failed, absl::StatusCode::kDataLoss, "start_job.region_input.values",
                 "was truncated by its owner while job " + std::to_string(failed.job_id));
  EXPECT_EQ(failed.in_region, std::nullopt);

  // The other stream's jobs are untouched.
  for (int received = 0; received < 3; ++received) {
    absl::StatusOr<LayerResult> result = other_stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    const uint32_t l = result->layer_index;
    ASSERT_LT(l, 3u);
    ExpectSameAsSlabResult(SlabResult(other_layers[l]), *result);
  }
  EXPECT_TRUE(other_stream->Close().ok());

  // The victim region stays unusable, even with its file whole again (its mapping holds
  // zero pages now), but it unregisters.
  ASSERT_EQ(truncate(VictimPath().c_str(), static_cast<off_t>(victim_->region().size())), 0);
  victim_->Fill(0, victim_layer_->view());
  ExpectJobError(RunOne(victim_job_), absl::StatusCode::kFailedPrecondition,
                 "start_job.region_input.keys.region_id", "was truncated by its owner");
  const size_t regions = server_->server->context().regions.regions();
  EXPECT_TRUE(client().UnregisterRegion(victim_->region().region_id()).ok());
  EXPECT_EQ(server_->server->context().regions.regions(), regions - 1);

  ExpectGoldenStillRight();
}

TEST_F(ShmTruncationTest, OutputTruncatedMidJobFailsNamingTheOutput) {
  ASSERT_NO_FATAL_FAILURE(MakeVictim(2));
  ASSERT_TRUE(victim_job_.shm_output.has_value());
  // The inputs stay in the file; the output slot (after them) is cut away, so the engine's
  // reads succeed and the result's writes into the region fault.
  truncation_.Arm(victim_->region().name(),
                  RoundUpToPage(victim_job_.shm_output->keys_offset));
  const LayerResult failed = RunOne(victim_job_);
  EXPECT_EQ(truncation_.times(), 1);
  ExpectJobError(failed, absl::StatusCode::kDataLoss, "start_job.region_output.out_keys",
                 "was truncated by its owner while job " + std::to_string(failed.job_id));
  EXPECT_EQ(failed.in_region, std::nullopt);
  // The region is spoilt for later jobs too (the file is as short as the client left it).
  ExpectJobError(RunOne(victim_job_), absl::StatusCode::kFailedPrecondition,
                 "start_job.region_input.keys.region_id", "truncated by its owner");
  ExpectGoldenStillRight();
}

TEST_F(ShmTruncationTest, TruncatedBeforeTheJobIsAnEarlyErrorAndHarmless) {
  ASSERT_NO_FATAL_FAILURE(MakeVictim(3));
  ASSERT_EQ(truncate(VictimPath().c_str(), 0), 0);
  ExpectJobError(RunOne(victim_job_), absl::StatusCode::kFailedPrecondition,
                 "start_job.region_input.keys.region_id", "shrank");
  // Nothing faulted, so the region works again once the file is whole.
  ASSERT_EQ(truncate(VictimPath().c_str(), static_cast<off_t>(victim_->region().size())), 0);
  victim_->Fill(0, victim_layer_->view());
  ExpectSameAsSlabResult(SlabResult(*victim_layer_), RunOne(victim_job_));
}

}  // namespace
}  // namespace centroidkv::client
