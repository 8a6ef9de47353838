// The server as a whole: health and reflection services, GetInfo, unix sockets, many
// concurrent streams, backpressure under a small memory budget, and graceful drain.
#include "service/server.h"

#include <gtest/gtest.h>
#include <grpcpp/generic/generic_stub.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <thread>

#include "centroidkv/client/client.h"
#include "centroidkv/kernels/engine_factory.h"
#include "tests/service/prometheus_text.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

// A unary call through the generic stub (no generated code): returns the reply bytes.
grpc::Status GenericUnary(const std::string& target, const std::string& method,
                          const std::string& request_bytes, std::string* reply_bytes) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer reply;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &reply,
                 [&done](grpc::Status status) { done.set_value(status); });
  grpc::Status status = done.get_future().get();
  std::vector<grpc::Slice> slices;
  reply.Dump(&slices);
  reply_bytes->clear();
  for (const grpc::Slice& s : slices) {
    reply_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return status;
}

TEST(ServerTest, HealthServiceReportsServing) {
  auto server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  std::string reply;
  // HealthCheckRequest{service: ""} is empty; the reply is {status: SERVING(1)} = 08 01.
  ASSERT_TRUE(GenericUnary(server->target(), "/grpc.health.v1.Health/Check", "", &reply).ok());
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
  const std::string name = "centroidkv.v1.CentroidKV";
  const std::string request = std::string("\x0a", 1) + static_cast<char>(name.size()) + name;
  ASSERT_TRUE(GenericUnary(server->target(), "/grpc.health.v1.Health/Check", request, &reply).ok());
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
}

// A bidi call through the generic stub: one request, reads until the server's reply.
class ReflectionCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReflectionCall(grpc::GenericStub* stub, const std::string& request_bytes) {
    grpc::Slice slice(request_bytes);
    request_ = grpc::ByteBuffer(&slice, 1);
    stub->PrepareBidiStreamingCall(&context_,
                                   "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::StubOptions(), this);
    StartWrite(&request_);
    StartRead(&reply_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (ok) {
      std::vector<grpc::Slice> slices;
      reply_.Dump(&slices);
      for (const grpc::Slice& s : slices) {
        text_.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      StartRead(&reply_);
    }
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  grpc::Status Await(std::string* text) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    *text = text_;
    return status_;
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, reply_;
  std::string text_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

TEST(ServerTest, ReflectionListsTheService) {
  auto server = StartLoopbackServer();
  ASSERT_NE(server, nullptr);
  grpc::GenericStub stub(grpc::CreateChannel(server->target(), grpc::InsecureChannelCredentials()));
  // ServerReflectionRequest{list_services: "*"}: field 7, length 1.
  ReflectionCall call(&stub, std::string("\x3a\x01*", 3));
  std::string text;
  ASSERT_TRUE(call.Await(&text).ok());
  EXPECT_NE(text.find("centroidkv.v1.CentroidKV"), std::string::npos);
  EXPECT_NE(text.find("grpc.health.v1.Health"), std::string::npos);
}

TEST(ServerTest, GetInfoDescribesBackendsLimitsAndDefaults) {
  ServerOptions options;
  options.max_job_bytes = 12345678;
  options.engine_limits.max_chunk_size = 1000;
  options.worker_threads = 3;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  grpc::ClientContext context;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(&context, v1::GetInfoRequest(), &info).ok());
  EXPECT_FALSE(info.version().empty());
  EXPECT_NE(std::find(info.backends().begin(), info.backends().end(), "reference"),
            info.backends().end());
  EXPECT_FALSE(info.default_backend().empty());
  EXPECT_EQ(info.limits().max_job_bytes(), 12345678u);
  EXPECT_EQ(info.limits().max_chunk_size(), 1000u);
  EXPECT_EQ(info.worker_threads(), 3u);
  EXPECT_EQ(info.defaults().chunk_size(), 256u);
  EXPECT_EQ(info.defaults().sink_tokens(), 16u);
  EXPECT_EQ(info.defaults().recent_tokens(), 64u);
  EXPECT_DOUBLE_EQ(info.defaults().target_ratio(), 0.25);
  EXPECT_FALSE(info.defaults().has_min_similarity()) << "the floor is off by default";
  // Devices: one per GPU backend listed, in the same order in both fields (none on a machine
  // without a usable CUDA device, like CI).
  ASSERT_EQ(info.devices_size(), info.device_info_size());
  int gpu_backends = 0;
  for (const std::string& backend : info.backends()) {
    gpu_backends += backend.rfind("cuda:", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(info.device_info_size(), gpu_backends);
  for (int i = 0; i < info.device_info_size(); ++i) {
    const v1::Device& device = info.device_info(i);
    EXPECT_EQ(device.name(), info.devices(i));
    EXPECT_NE(std::find(info.backends().begin(), info.backends().end(), device.backend()),
              info.backends().end());
    EXPECT_GT(device.memory_bytes(), 0u);
    EXPECT_GE(device.compute_major(), 8u) << "the CUDA backend is built for sm_80 and later";
  }
  if (gpu_backends == 0) {
    EXPECT_NE(info.default_backend().rfind("cuda:", 0), 0u);
  }
}

TEST(ServerTest, ListensOnUnixSocket) {
  ServerOptions options;
  const std::string path = "/tmp/ckv-service-test-" + std::to_string(getpid()) + ".sock";
  options.listen_address = "unix://" + path;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  client::ClientOptions client_options;
  client_options.target = (*server)->target();
  auto client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  test::RandomLayerSpec spec;
  spec.prototypes = 4;
  test::RandomLayer layer = test::RandomLayer::Generate(spec);
  client::LayerJob job;
  job.layer = layer.view();
  job.options.chunk_size = 16;
  job.options.sink_tokens = 2;
  job.options.recent_tokens = 4;
  auto results = (*client)->CompressLayers({job});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].total_entries(), 2 * 16);  // ceil(0.25 * 64) per head
}

// Many streams at once, each with several jobs in flight, through the client library.
TEST(ServerTest, ManyConcurrentStreamsGetTheirOwnResults) {
  ServerOptions options;
  options.worker_threads = 2;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto engines = EngineSet::CreateAvailable();
  const ClusterEngine* in_process = *engines->Select(BackendKind::kAuto);
  client::ClientOptions client_options;
  client_options.target = server->target();
  client_options.slab_bytes = 4096;
  auto client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok());

  constexpr int kStreams = 8, kJobsPerStream = 6;
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      std::vector<test::RandomLayer> layers;
      std::vector<client::LayerJob> jobs;
      for (int j = 0; j < kJobsPerStream; ++j) {
        test::RandomLayerSpec spec;
        spec.num_heads = 1 + (s + j) % 4;
        spec.num_tokens = 40 + 13 * j;
        spec.key_dim = 8 << (j % 3);
        spec.value_dim = 4 + s;
        spec.prototypes = 5;
        spec.with_counts = j % 2 == 1;
        spec.seed = static_cast<uint64_t>(1000 * s + j);
        layers.push_back(test::RandomLayer::Generate(spec));
      }
      for (int j = 0; j < kJobsPerStream; ++j) {
        client::LayerJob job;
        job.layer_index = static_cast<uint32_t>(j);
        job.layer = layers[j].view();
        job.options.chunk_size = 8;
        job.options.sink_tokens = 1;
        job.options.recent_tokens = 3;
        job.options.target_ratio = 0.3;
        job.output_dtype = DType::kFloat32;
        jobs.push_back(job);
      }
      auto results = (*client)->CompressLayers(jobs);
      if (!results.ok()) {
        ++failures;
        return;
      }
      for (int j = 0; j < kJobsPerStream; ++j) {
        auto expected = in_process->Compress(jobs[j].layer, jobs[j].options);
        const client::LayerResult& got = (*results)[j];
        if (!expected.ok() || got.layer_index != static_cast<uint32_t>(j) ||
            got.counts != expected->counts || got.assignment != expected->assignment ||
            got.KeysAsFloat() != expected->keys || got.ValuesAsFloat() != expected->values) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(server->context().metrics.jobs_ended(JobOutcome::kCompleted), kStreams * kJobsPerStream);
  EXPECT_EQ(server->context().budget.used(), 0u);
}

// With a budget far smaller than the offered load, reading pauses instead of buffering:
// every job still completes, and the budget is never exceeded.
TEST(ServerTest, BackpressureKeepsMemoryWithinBudget) {
  test::RandomLayerSpec spec;
  spec.num_heads = 2;
  spec.num_tokens = 1024;
  spec.key_dim = 16;
  spec.value_dim = 16;
  spec.prototypes = 8;
  test::RandomLayer layer = test::RandomLayer::Generate(spec);
  // Footprint of one job: input 256 KiB + result 256 KiB + counts and assignment 16 KiB.
  ServerOptions options;
  options.max_stream_bytes = 1200 << 10;  // two jobs per stream
  options.max_total_bytes = 1700 << 10;   // three jobs over all streams
  options.worker_threads = 2;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  client::ClientOptions client_options;
  client_options.target = server->target();
  auto client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok());

  std::atomic<bool> running{true};
  std::atomic<uint64_t> peak{0};
  std::thread sampler([&] {
    while (running) {
      peak = std::max<uint64_t>(peak, server->context().budget.used());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  client::LayerJob job;
  job.layer = layer.view();
  job.options.chunk_size = 64;
  job.options.sink_tokens = 4;
  job.options.recent_tokens = 16;
  job.output_dtype = DType::kFloat32;
  std::vector<std::thread> streams;
  std::atomic<int> completed{0};
  for (int s = 0; s < 3; ++s) {
    streams.emplace_back([&] {
      auto results = (*client)->CompressLayers(std::vector<client::LayerJob>(8, job));
      if (!results.ok()) return;
      for (const auto& result : *results) completed += result.status.ok() ? 1 : 0;
    });
  }
  for (auto& thread : streams) thread.join();
  running = false;
  sampler.join();
  EXPECT_EQ(completed.load(), 24);
  EXPECT_LE(peak.load(), options.max_total_bytes);
  EXPECT_GT(peak.load(), 0u);
  EXPECT_EQ(server->context().budget.used(), 0u);
}

TEST(ServerTest, JobLargerThanStreamBudgetIsAResourceExhaustedJobError) {
  ServerOptions options;
  options.max_stream_bytes = 64 << 10;
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  test::RandomLayerSpec spec;
  spec.num_tokens = 1024;
  test::RandomLayer layer = test::RandomLayer::Generate(spec);
  RawStream stream(stub.get());
  stream.SendJob(1, layer.view(), CompressOptions{});
  // The job can never fit: a JobError for it; the stream itself ends well.
  std::vector<v1::CompressResponse> responses;
  const grpc::Status status = stream.Finish(&responses);
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 1u);
  ASSERT_TRUE(responses[0].has_error());
  EXPECT_EQ(responses[0].error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(responses[0].error().field(), "start_job.num_tokens");
  EXPECT_NE(responses[0].error().message().find("max_stream_bytes"), std::string::npos)
      << responses[0].error().message();
  EXPECT_EQ(server->context().budget.used(), 0u);
}

// Shutdown: health turns NOT_SERVING (so probes and balancers stop sending here) while
// /metrics still answers, the job in flight finishes and is delivered, a job announced
// during the drain is refused with UNAVAILABLE (so the client can resend it elsewhere).
// The client half-closes, so nothing it sent is left unread when the server closes the
// connection.
TEST(ServerTest, GracefulShutdownFinishesJobsInFlightAndRefusesNewOnes) {
  ServerOptions options;
  options.worker_threads = 1;
  options.grace_period = std::chrono::seconds(30);
  options.metrics_listen = "127.0.0.1:0";
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  test::RandomLayerSpec spec;
  spec.num_heads = 8;
  spec.num_tokens = 4096;
  spec.key_dim = 64;
  spec.value_dim = 8;
  test::RandomLayer slow = test::RandomLayer::Generate(spec);
  CompressOptions slow_options;
  slow_options.chunk_size = 512;
  slow_options.max_passes = 2;
  RawStream stream(stub.get());
  ASSERT_TRUE(stream.SendJob(1, slow.view(), slow_options, 1 << 20, v1::BACKEND_REFERENCE));
  while (server->context().metrics.jobs_received() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::thread shutdown([&server] { server->Shutdown(); });
  while (!server->context().draining.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // The job is still computing, so the server is draining, not yet shut down.
  std::string reply;
  const std::string name = "centroidkv.v1.CentroidKV";
  ASSERT_TRUE(GenericUnary(server->target(), "/grpc.health.v1.Health/Check", "", &reply).ok());
  EXPECT_EQ(reply, std::string("\x08\x02", 2)) << "overall health must be NOT_SERVING";
  const std::string request = std::string("\x0a", 1) + static_cast<char>(name.size()) + name;
  ASSERT_TRUE(GenericUnary(server->target(), "/grpc.health.v1.Health/Check", request, &reply).ok());
  EXPECT_EQ(reply, std::string("\x08\x02", 2)) << "the service's health must be NOT_SERVING";
  auto scraped = ScrapeMetrics(server->metrics_port());
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  auto during = ParsePrometheusText(*scraped);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(*SampleValue(*during, "centroidkv_draining", "centroidkv_draining"), 1);
  test::RandomLayerSpec small_spec;
  test::RandomLayer small = test::RandomLayer::Generate(small_spec);
  ASSERT_TRUE(stream.SendJob(2, small.view(), CompressOptions{}));
  std::vector<v1::CompressResponse> responses;
  const grpc::Status status = stream.Finish(&responses);
  shutdown.join();

  std::map<uint64_t, v1::JobError> errors;
  auto results = DecodeResults(responses, &errors);
  ASSERT_EQ(results.count(1), 1u) << "the job in flight was not delivered; stream ended with "
                                  << status.error_message();
  auto engines = EngineSet::CreateAvailable();
  auto expected = (*engines->Select(BackendKind::kReference))->Compress(slow.view(), slow_options);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(results[1].counts, expected->counts);
  ASSERT_EQ(errors.count(2), 1u);
  EXPECT_EQ(errors[2].code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(server->context().executor->pending(), 0);
  auto after = ParsePrometheusText(server->context().metrics.Render());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*SampleValue(*after, "centroidkv_errors_total", "centroidkv_errors_total",
                         {{"code", "UNAVAILABLE"}, {"scope", "job"}}),
            1)
      << "the refused job is counted once, as a job error";
}

// A stream with nothing in flight ends at once with UNAVAILABLE when the server drains.
TEST(ServerTest, IdleStreamEndsWithUnavailableOnShutdown) {
  ServerOptions options;
  options.grace_period = std::chrono::seconds(30);
  auto server = StartLoopbackServer(options);
  ASSERT_NE(server, nullptr);
  auto stub = MakeStub(server->target());
  RawStream stream(stub.get());
  test::RandomLayer small = test::RandomLayer::Generate(test::RandomLayerSpec{});
  ASSERT_TRUE(stream.SendJob(1, small.view(), CompressOptions{}));
  v1::CompressResponse response;
  std::vector<v1::CompressResponse> responses;
  while (responses.size() < 2 && stream.Read(&response)) responses.push_back(response);
  const auto start = std::chrono::steady_clock::now();
  server->Shutdown();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  while (stream.Read(&response)) responses.push_back(response);
  EXPECT_EQ(stream.Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(seconds, 10.0) << "an idle stream must not hold the drain for the grace period";
  EXPECT_EQ(DecodeResults(responses).count(1), 1u);
}

}  // namespace
}  // namespace centroidkv::service::testing
