// Callers against a real loopback server: bearer tokens (missing, wrong, revoked by a
// reload), health and reflection without a token, per-caller stream and job limits (one
// caller over its limit, another unaffected), job ids private to their stream, and the
// per-caller counters of /metrics (names, never tokens).
#include "service/security/caller_gate.h"

#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "centroidkv/client/client.h"
#include "centroidkv/kernels/engine_factory.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"
#include "tests/testing/result_checks.h"

namespace centroidkv::service::testing {
namespace {

using ::centroidkv::test::RandomLayer;

constexpr char kTokenA[] = "tok-a-3f9c1e7d";
constexpr char kTokenB[] = "tok-b-8d2a44c0";

class TokensFile {
 public:
  TokensFile() {
    char pattern[] = "/tmp/ckv-tokens-XXXXXX";
    const int fd = mkstemp(pattern);
    close(fd);
    path_ = pattern;
  }
  ~TokensFile() { std::remove(path_.c_str()); }
  void Write(const std::string& text) const { std::ofstream(path_) << text; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

CompressOptions SmallOptions() {
  CompressOptions options{.target_ratio = 0.5, .chunk_size = 32, .sink_tokens = 2,
      .recent_tokens = 4};
  return options;
}

RandomLayer SmallLayer(uint64_t seed) {
  return RandomLayer::Generate(test::Spec(2, 96, 16, 16, seed));
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectAs(const Server& server,
                                                          const std::string& token) {
  client::ClientOptions options;
  options.target = server.target();
  options.auth_token = token;
  return client::Client::Connect(options);
}

absl::Status CompressOne(client::Client& client, uint64_t seed) {
  RandomLayer layer = SmallLayer(seed);
  client::LayerJob job;
  job.layer = layer.view();
  job.options = SmallOptions();
  absl::StatusOr<std::vector<client::LayerResult>> results = client.CompressLayers({job});
  if (!results.ok()) return results.status();
  return (*results)[0].status;
}

class CallerGateTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = {}) {
    tokens_.Write(std::string(kTokenA) + " worker-a\n# a comment\n\n" + kTokenB + " worker-b\n");
    options.security.auth_tokens_file = tokens_.path();
    options.worker_threads = 2;
    server_ = StartLoopbackServer(options);
    ASSERT_NE(server_, nullptr);
  }

  TokensFile tokens_;
  std::unique_ptr<Server> server_;
};

TEST_F(CallerGateTest, MissingAndWrongTokensAreUnauthenticated) {
  StartServer();
  for (const std::string token : {"", "tok-unknown", "worker-a"}) {
    auto client = ConnectAs(*server_, token);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<client::ServerInfo> info = (*client)->GetInfo();
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated) << "token " << token;
    EXPECT_EQ(CompressOne(**client, 1).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(server_->context().metrics.streams_opened(), 0) << "a refused stream was served";
  auto good = ConnectAs(*server_, kTokenA);
  ASSERT_TRUE(good.ok());
  EXPECT_TRUE((*good)->GetInfo().ok());
  EXPECT_TRUE(CompressOne(**good, 2).ok());
}

TEST_F(CallerGateTest, RawStreamWithoutTokenGetsNothingBuffered) {
  StartServer();
  auto stub = MakeStub(server_->target());
  RawStream stream(stub.get());
  RandomLayer layer = SmallLayer(3);
  stream.SendJob(1, layer.view(), SmallOptions());  // may fail midway: the stream is refused
  std::vector<v1::CompressResponse> responses;
  grpc::Status status = stream.Finish(&responses);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(responses.empty());
  EXPECT_EQ(server_->context().metrics.jobs_received(), 0);
  EXPECT_EQ(server_->context().budget.used(), 0u);
}

TEST_F(CallerGateTest, HealthNeedsNoToken) {
  StartServer();
  auto channel = grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::Slice empty(std::string(""));  // HealthCheckRequest{} serializes to no bytes
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &reply, [&done](grpc::Status status) { done.set_value(status); });
  EXPECT_TRUE(done.get_future().get().ok());
}

TEST_F(CallerGateTest, ReloadRevokesARemovedToken) {
  StartServer();
  auto a = ConnectAs(*server_, kTokenA);
  auto b = ConnectAs(*server_, kTokenB);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->GetInfo().ok());
  // A malformed file keeps the tokens in force.
  tokens_.Write("only-one-field\n");
  EXPECT_EQ(server_->ReloadTokens().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*a)->GetInfo().ok());
  tokens_.Write(std::string(kTokenB) + " worker-b\n");
  ASSERT_TRUE(server_->ReloadTokens().ok());
  EXPECT_EQ((*a)->GetInfo().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CompressOne(**a, 4).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*b)->GetInfo().ok());
  EXPECT_TRUE(CompressOne(**b, 5).ok());
}

TEST_F(CallerGateTest, MetricsCountCallersByNameNeverByToken) {
  StartServer();
  auto a = ConnectAs(*server_, kTokenA);
  auto bad = ConnectAs(*server_, "tok-secret-wrong");
  ASSERT_TRUE(a.ok() && bad.ok());
  ASSERT_TRUE(CompressOne(**a, 6).ok());
  ASSERT_TRUE((*a)->GetInfo().ok());
  EXPECT_FALSE((*bad)->GetInfo().ok());
  const std::string text = server_->context().metrics.Render();
  EXPECT_NE(text.find("centroidkv_caller_requests_total{caller=\"worker-a\",rpc=\"Compress\"} 1"),
            std::string::npos)
      << text;
  // Two GetInfo calls: the client asks once for the server's slab limit before its first
  // job, then the explicit one above.
  EXPECT_NE(text.find("centroidkv_caller_requests_total{caller=\"worker-a\",rpc=\"GetInfo\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("centroidkv_caller_rejections_total{caller=\"unauthenticated\","
                      "reason=\"bad_token\"} 1"),
            std::string::npos);
  EXPECT_EQ(text.find(kTokenA), std::string::npos);
  EXPECT_EQ(text.find("tok-secret-wrong"), std::string::npos);
}

TEST_F(CallerGateTest, CallerOverItsStreamLimitIsRefusedWhileAnotherWorks) {
  ServerOptions options;
  options.security.max_caller_streams = 1;
  StartServer(options);
  auto stub = MakeStub(server_->target());
  RawStream first(stub.get(), std::chrono::milliseconds(0), kTokenA);
  RandomLayer layer = SmallLayer(7);
  // The first stream is live (a job announced, no data yet) and holds worker-a's one slot.
  ASSERT_TRUE(first.Write(StartJobRequest(1, layer.view(), SmallOptions())));
  // Write() returns once the message is queued: wait until the server holds the slot, or the
  // second stream could be the one that takes it.
  const auto held_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server_->context().callers.registry().usage("worker-a").streams != 1 &&
         std::chrono::steady_clock::now() < held_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server_->context().callers.registry().usage("worker-a").streams, 1);
  RawStream second(stub.get(), std::chrono::milliseconds(0), kTokenA);
  EXPECT_EQ(second.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto b = ConnectAs(*server_, kTokenB);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(CompressOne(**b, 8).ok()) << "another caller must be unaffected";
  first.context().TryCancel();
  // Once the first stream is gone, worker-a may open a stream again.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  absl::Status again;
  auto a = ConnectAs(*server_, kTokenA);
  ASSERT_TRUE(a.ok());
  do {
    again = CompressOne(**a, 9);
  } while (!again.ok() && std::chrono::steady_clock::now() < give_up);
  EXPECT_TRUE(again.ok()) << again;
  // The server frees the slot in OnDone, which may run just after the client saw the end.
  int32_t open_streams = 1;
  while ((open_streams = server_->context().callers.registry().usage("worker-a").streams) != 0 &&
         std::chrono::steady_clock::now() < give_up + std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(open_streams, 0);
}

TEST_F(CallerGateTest, CallerOverItsJobLimitGetsAJobErrorWhileAnotherWorks) {
  ServerOptions options;
  options.security.max_caller_jobs = 1;
  StartServer(options);
  auto stub = MakeStub(server_->target());
  RandomLayer layer = SmallLayer(10);
  RawStream a(stub.get(), std::chrono::milliseconds(0), kTokenA);
  // Job 1 is admitted (announced, its data not sent yet): worker-a has 1 job in flight.
  ASSERT_TRUE(a.Write(StartJobRequest(1, layer.view(), SmallOptions())));
  // Job 2 of the same caller is over the limit: a RESOURCE_EXHAUSTED JobError, the stream
  // goes on, and its slabs are dropped unread.
  ASSERT_TRUE(a.SendJob(2, layer.view(), SmallOptions()));
  v1::CompressResponse response;
  ASSERT_TRUE(a.Read(&response));
  ASSERT_TRUE(response.has_error());
  EXPECT_EQ(response.error().job_id(), 2u);
  EXPECT_EQ(response.error().code(), static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(response.error().message().find("max_caller_jobs"), std::string::npos);
  // worker-b is not limited by worker-a's jobs.
  RawStream b(stub.get(), std::chrono::milliseconds(0), kTokenB);
  ASSERT_TRUE(b.SendJob(1, layer.view(), SmallOptions()));
  std::vector<v1::CompressResponse> b_responses;
  ASSERT_TRUE(b.Finish(&b_responses).ok());
  ASSERT_EQ(DecodeResults(b_responses).count(1), 1u);
  // worker-a's admitted job completes once its data arrives, and frees the slot.
  ASSERT_TRUE(a.SendSlabs(1, layer.view()));
  ASSERT_TRUE(a.Read(&response));
  ASSERT_TRUE(response.has_result()) << response.DebugString().substr(0, 200);
  EXPECT_EQ(response.result().job_id(), 1u);
  std::vector<v1::CompressResponse> rest;
  EXPECT_TRUE(a.Finish(&rest).ok());
  EXPECT_EQ(server_->context().callers.registry().usage("worker-a").jobs, 0);
  EXPECT_EQ(server_->context().callers.registry().usage("worker-a").bytes, 0u);
  const std::string text = server_->context().metrics.Render();
  EXPECT_NE(text.find("centroidkv_caller_rejections_total{caller=\"worker-a\","
                      "reason=\"job_limit\"} 1"),
            std::string::npos)
      << text;
}

// A caller cannot reach another caller's job by its id: ids belong to their stream.
TEST_F(CallerGateTest, AnotherCallersJobIdReachesNothingOfIt) {
  StartServer();
  auto stub = MakeStub(server_->target());
  RandomLayer a_layer = SmallLayer(11);
  RandomLayer b_layer = SmallLayer(12);
  RawStream a(stub.get(), std::chrono::milliseconds(0), kTokenA);
  ASSERT_TRUE(a.Write(StartJobRequest(7, a_layer.view(), SmallOptions())));
  // worker-b cannot feed worker-a's job 7: slabs for an id it never announced end its own
  // stream, naming the field.
  RawStream intruder(stub.get(), std::chrono::milliseconds(0), kTokenB);
  intruder.SendSlabs(7, b_layer.view());
  const grpc::Status refused = intruder.Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("slab.job_id 7"), std::string::npos);
  // worker-b cancels id 7 and announces its own job 7 with other data: its own job only.
  RawStream b(stub.get(), std::chrono::milliseconds(0), kTokenB);
  v1::CompressRequest cancel;
  cancel.mutable_cancel_job()->set_job_id(7);
  ASSERT_TRUE(b.Write(cancel));
  ASSERT_TRUE(b.SendJob(7, b_layer.view(), SmallOptions()));
  std::vector<v1::CompressResponse> b_responses;
  ASSERT_TRUE(b.Finish(&b_responses).ok());
  // worker-a's job 7 was untouched: its data now arrives and its own result comes back.
  ASSERT_TRUE(a.SendSlabs(7, a_layer.view()));
  std::vector<v1::CompressResponse> a_responses;
  ASSERT_TRUE(a.Finish(&a_responses).ok());
  auto engines = EngineSet::CreateAvailable(EngineLimits{});
  const ClusterEngine& engine = **engines->Select(BackendKind::kAuto);
  auto b_expected = engine.Compress(b_layer.view(), SmallOptions());
  auto a_expected = engine.Compress(a_layer.view(), SmallOptions());
  ASSERT_TRUE(a_expected.ok() && b_expected.ok());
  auto b_results = DecodeResults(b_responses);
  auto a_results = DecodeResults(a_responses);
  ASSERT_EQ(b_results.size(), 1u);
  ASSERT_EQ(a_results.size(), 1u);
  test::ExpectBitIdentical(*b_expected, b_results[7]);
  test::ExpectBitIdentical(*a_expected, a_results[7]);
}

}  // namespace
}  // namespace centroidkv::service::testing
