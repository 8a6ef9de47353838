// Timeouts on a real loopback server: a job whose slabs stop coming fails with a
// DEADLINE_EXCEEDED JobError naming the missing tensor and gives its reservation back (the
// stream goes on); clients that only announce big jobs (holding the budget) delay another
// client's job by at most the timeout, and while another job waits for memory they lose
// reservations they do not earn by sending; an idle stream ends.
#include "service/stream_watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

CompressOptions Options() {
  CompressOptions options;
  options.target_ratio = 0.5;
  return options;
}

// 2 heads x 4096 tokens x (64 + 64) float32: 4 MiB of input, ~8 MiB of footprint.
const test::RandomLayer& BigLayer() {
  static const test::RandomLayer layer =
      test::RandomLayer::Generate(test::Spec(2, 4096, 64, 64, 3));
  return layer;
}

TEST(StreamWatchdogTest, IncompleteJobFailsAloneAndReleasesItsReservation) {
  ServerOptions options;
  options.worker_threads = 2;
  options.incomplete_job_timeout = std::chrono::milliseconds(400);
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  RawStream stream(stub.get());
  const LayerView view = BigLayer().view();
  ASSERT_TRUE(stream.Write(StartJobRequest(1, view, Options())));
  ASSERT_TRUE(stream.Write(SlabRequest(1, v1::TENSOR_KEYS, 0, view.keys, 1 << 16)));
  const auto start = Clock::now();
  v1::CompressResponse response;
  ASSERT_TRUE(stream.Read(&response));
  EXPECT_LT(SecondsSince(start), 2.0);
  ASSERT_TRUE(response.has_error());
  EXPECT_EQ(response.error().job_id(), 1u);
  EXPECT_EQ(response.error().code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_NE(response.error().message().find("job 1 still incomplete"), std::string::npos)
      << response.error().message();
  EXPECT_EQ(response.error().field(), "keys") << response.error().message();
  EXPECT_EQ(server->context().budget.used(), 0u);
  // The stream goes on: the job's late slabs are dropped, the next job is answered.
  ASSERT_TRUE(stream.Write(SlabRequest(1, v1::TENSOR_KEYS, 1 << 16, view.keys, 1 << 16)));
  const test::RandomLayer small = test::RandomLayer::Generate(test::Spec(1, 64, 8, 8, 4));
  ASSERT_TRUE(stream.SendJob(2, small.view(), Options()));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(stream.Finish(&responses).ok());
  EXPECT_EQ(DecodeResults(responses).count(2), 1u);
}

TEST(StreamWatchdogTest, ReservationHogsDelayAnotherJobByAtMostTheTimeout) {
  constexpr auto kTimeout = std::chrono::milliseconds(500);
  ServerOptions options;
  options.worker_threads = 2;
  options.max_total_bytes = 20 << 20;  // two of the hogs' jobs fit, the third waits
  options.incomplete_job_timeout = kTimeout;
  options.min_receive_bytes_per_second = 0;  // the timeout alone (the next test: both)
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  const LayerView view = BigLayer().view();
  std::vector<std::unique_ptr<RawStream>> hogs;
  for (int i = 0; i < 4; ++i) {
    hogs.push_back(std::make_unique<RawStream>(stub.get()));
    ASSERT_TRUE(hogs.back()->Write(StartJobRequest(1, view, Options())));  // and nothing
  }
  while (server->context().budget.used() < (16u << 20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto start = Clock::now();
  RawStream honest(stub.get());
  ASSERT_TRUE(honest.SendJob(7, view, Options(), 1 << 20));
  std::vector<v1::CompressResponse> responses;
  ASSERT_TRUE(honest.Finish(&responses).ok());
  const double seconds = SecondsSince(start);
  EXPECT_EQ(DecodeResults(responses).count(7), 1u);
  // Two timeouts at most (the hogs admitted first, then the ones that waited), plus the
  // watchdog's tick and the job itself.
  EXPECT_LT(seconds, 2 * 0.5 + 2.0) << "the honest job waited behind the reservations";
  for (auto& hog : hogs) {  // each hog's job expired alone; its stream is still open
    v1::CompressResponse expired;
    ASSERT_TRUE(hog->Read(&expired));
    EXPECT_EQ(expired.error().code(), static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded));
    EXPECT_TRUE(hog->Finish().ok());
  }
  EXPECT_EQ(server->context().budget.used(), 0u);
}

// 16 streams each reserve a job's memory, send one 64 KiB slab and go quiet; the budget
// holds two such jobs. An honest job on another stream still completes within twice its
// time alone (plus the watchdog's ticks): while it waits, each hog's reservation is not
// earned (16 MiB/s of waiting less a 256 KiB slack) and goes to it; each hog gets
// RESOURCE_EXHAUSTED naming the tensor it did not send, and its stream goes on.
TEST(StreamWatchdogTest, ReservationsNotEarnedYieldToAWaitingJob) {
  ServerOptions options;
  options.worker_threads = 2;
  options.max_total_bytes = 20 << 20;
  options.receive_slack_bytes = 256 << 10;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  const LayerView view = BigLayer().view();
  auto run_honest = [&](uint64_t job_id) {
    const auto start = Clock::now();
    RawStream honest(stub.get());
    EXPECT_TRUE(honest.SendJob(job_id, view, Options(), 1 << 20));
    std::vector<v1::CompressResponse> responses;
    EXPECT_TRUE(honest.Finish(&responses).ok());
    EXPECT_EQ(DecodeResults(responses).count(job_id), 1u);
    return SecondsSince(start);
  };
  const double alone = run_honest(6);
  constexpr int kHogs = 16;
  std::vector<std::unique_ptr<RawStream>> hogs;
  for (int i = 0; i < kHogs; ++i) {
    hogs.push_back(std::make_unique<RawStream>(stub.get()));
    ASSERT_TRUE(hogs.back()->Write(StartJobRequest(1, view, Options())));
    ASSERT_TRUE(hogs.back()->Write(SlabRequest(1, v1::TENSOR_KEYS, 0, view.keys, 1 << 16)));
  }
  while (server->context().budget.used() < (16u << 20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double contended = run_honest(7);
  EXPECT_LT(contended, 2 * alone + 0.5)
      << "alone " << alone << " s: the honest job waited behind the reservations";
  // Hogs that held a reservation while a job waited lost it; the others may still wait.
  int refused = 0;
  for (auto& hog : hogs) {
    std::vector<v1::CompressResponse> responses;
    EXPECT_TRUE(hog->Finish(&responses).ok());
    ASSERT_EQ(responses.size(), 1u);
    ASSERT_TRUE(responses[0].has_error());
    const v1::JobError& error = responses[0].error();
    if (error.code() == static_cast<int32_t>(absl::StatusCode::kResourceExhausted)) {
      ++refused;
      EXPECT_EQ(error.field(), "keys") << error.message();
      EXPECT_NE(error.message().find("min_receive_bytes_per_second"), std::string::npos)
          << error.message();
    } else {  // ended by the half-close, short of its slabs
      EXPECT_EQ(error.code(), static_cast<int32_t>(absl::StatusCode::kFailedPrecondition))
          << error.message();
    }
  }
  EXPECT_GE(refused, 2) << "the two hogs holding the budget kept it";
  EXPECT_EQ(server->context().budget.used(), 0u);
}

TEST(StreamWatchdogTest, IdleStreamEnds) {
  ServerOptions options;
  options.idle_stream_timeout = std::chrono::milliseconds(300);
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  // A stream that ran a job, then went quiet.
  const test::RandomLayer layer = test::RandomLayer::Generate(test::Spec(1, 64, 8, 8, 4));
  RawStream stream(stub.get());
  ASSERT_TRUE(stream.SendJob(1, layer.view(), Options()));
  v1::CompressResponse response;
  while (stream.Read(&response)) {
  }
  const grpc::Status status = stream.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_NE(status.error_message().find("idle"), std::string::npos) << status.error_message();
}

TEST(StreamWatchdogTest, TickIsAQuarterOfTheShorterTimeoutWithinBounds) {
  using std::chrono::milliseconds;
  EXPECT_EQ(StreamWatchdog::TickFor(milliseconds(400), milliseconds(60000)), milliseconds(100));
  EXPECT_EQ(StreamWatchdog::TickFor(milliseconds(60000), milliseconds(600000)),
            milliseconds(1000));
  EXPECT_EQ(StreamWatchdog::TickFor(milliseconds(1), milliseconds(1)), milliseconds(10));
}

}  // namespace
}  // namespace centroidkv::service::testing
