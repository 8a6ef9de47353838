// centroidkv-soak: many streams of mixed job sizes against a running
// server for a given time, with clients among them that cancel jobs, disconnect mid-job,
// send garbage bytes and let deadlines pass. Every completed result is compared byte for
// byte with the in-process cpu engine's result for the same job (computed once per shape
// before the run); the server's RSS is sampled from /proc. At the end one JSON line:
// jobs, results checked and mismatched, statuses by code (expected and unexpected, per
// behaviour), RSS min / max / after the first minute / the largest of each 10 s. bench/soak.sh starts a server and
// runs it; exit code 1 if any status was unexpected or any result differed.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/workload.h"
#include "centroidkv/client/client.h"
#include "centroidkv/common/process_memory.h"
#include "centroidkv/kernels/engine_factory.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

// What one client iteration does.
enum class Behaviour { kNormal, kCancel, kDisconnect, kGarbage, kDeadline };
constexpr const char* kBehaviourNames[] = {"normal", "cancel", "disconnect", "garbage",
                                           "deadline"};

// One job shape, its data and the result the server must return for it.
struct Shape {
  std::string name;
  Workload workload;
  CompressOptions options;
  client::LayerResult expected;
};

struct Config {
  std::string target = "127.0.0.1:50051";
  int32_t server_pid = 0;
  double seconds = 300;
  int32_t streams = 64;
  int32_t connections = 8;
  uint64_t seed = 1;
};

// Statuses by behaviour and code, and whether each was expected.
class Tally {
 public:
  void Status(Behaviour behaviour, absl::StatusCode code, bool expected,
              const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string name = absl::StatusCodeToString(code);
    (expected ? expected_ : unexpected_)[name]++;
    by_behaviour_[kBehaviourNames[static_cast<int>(behaviour)]][name]++;
    if (!expected && first_unexpected_.size() < 5) {
      first_unexpected_.push_back(
          absl::StrCat(kBehaviourNames[static_cast<int>(behaviour)], ": ", name, ": ", message));
    }
  }
  void Result(bool matches) {
    std::lock_guard<std::mutex> lock(mu_);
    ++checked_;
    if (!matches) ++mismatched_;
  }
  void Submitted() { submitted_.fetch_add(1); }
  void Iteration(Behaviour behaviour) { iterations_[static_cast<int>(behaviour)].fetch_add(1); }

  bool clean() const { return unexpected_.empty() && mismatched_ == 0; }
  const std::vector<std::string>& first_unexpected() const { return first_unexpected_; }

  std::string Json(double seconds, const Config& config, uint64_t rss_min, uint64_t rss_max,
                   uint64_t rss_after_first_minute, int samples,
                   const std::vector<uint64_t>& rss_max_per_window) const {
    auto counts = [](const std::map<std::string, int64_t>& map) {
      std::vector<std::string> parts;
      for (const auto& [name, n] : map) parts.push_back(absl::StrCat("\"", name, "\":", n));
      return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
    };
    std::vector<std::string> behaviours;
    for (int b = 0; b < 5; ++b) {
      auto it = by_behaviour_.find(kBehaviourNames[b]);
      behaviours.push_back(absl::StrCat(
          "\"", kBehaviourNames[b], "\":{\"iterations\":", iterations_[b].load(),
          ",\"statuses\":",
          counts(it == by_behaviour_.end() ? std::map<std::string, int64_t>{} : it->second),
          "}"));
    }
    constexpr double kMiB = 1 << 20;
    std::vector<std::string> windows;
    for (uint64_t rss : rss_max_per_window) windows.push_back(absl::StrCat(rss >> 20));
    return absl::StrCat(
        "{\"seconds\":", seconds, ",\"streams\":", config.streams,
        ",\"connections\":", config.connections, ",\"jobs_submitted\":", submitted_.load(),
        ",\"results_checked\":", checked_, ",\"results_mismatched\":", mismatched_,
        ",\"statuses_expected\":", counts(expected_),
        ",\"statuses_unexpected\":", counts(unexpected_), ",\"behaviours\":{",
        absl::StrJoin(behaviours, ","), "},\"rss_mib\":{\"min\":", rss_min / kMiB,
        ",\"max\":", rss_max / kMiB, ",\"after_first_minute\":", rss_after_first_minute / kMiB,
        ",\"samples\":", samples, ",\"max_per_10s\":[", absl::StrJoin(windows, ","), "]}}");
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> expected_, unexpected_;
  std::map<std::string, std::map<std::string, int64_t>> by_behaviour_;
  std::vector<std::string> first_unexpected_;
  int64_t checked_ = 0, mismatched_ = 0;
  std::atomic<int64_t> submitted_{0};
  std::atomic<int64_t> iterations_[5] = {};
};

bool SameResult(const client::LayerResult& got, const client::LayerResult& want) {
  return got.offsets == want.offsets && got.counts == want.counts && got.keys == want.keys &&
         got.values == want.values && got.dtype == want.dtype;
}

// Shapes from tiny to a few MiB, clustered data (fp16), each with its expected result.
std::vector<Shape> MakeShapes(uint64_t seed) {
  struct Spec {
    const char* name;
    int32_t heads, tokens, dim, chunk;
    double ratio;
  };
  const Spec specs[] = {{"tiny", 2, 128, 64, 64, 0.5},
                        {"small", 4, 1024, 64, 256, 0.25},
                        {"medium", 8, 2048, 128, 512, 0.5},
                        {"large", 8, 4096, 128, 1024, 0.2}};
  std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  const ClusterEngine* cpu = *engines->Select(BackendKind::kCpu);
  std::vector<Shape> shapes;
  for (const Spec& spec : specs) {
    Shape shape;
    shape.name = spec.name;
    WorkloadSpec workload;
    workload.heads = spec.heads;
    workload.tokens = spec.tokens;
    workload.dim = spec.dim;
    workload.seed = seed + shapes.size();
    shape.workload = MakeWorkload(workload);
    shape.options.target_ratio = spec.ratio;
    shape.options.chunk_size = spec.chunk;
    absl::StatusOr<CompressResult> result = cpu->Compress(shape.workload.View(), shape.options);
    if (!result.ok()) {
      std::cerr << "soak: the in-process engine failed on " << spec.name << ": "
                << result.status() << "\n";
      std::exit(2);
    }
    shape.expected = client::LayerResultFromEngine(0, *result, DType::kFloat16);
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

client::LayerJob JobFor(const Shape& shape) {
  client::LayerJob job;
  job.layer = shape.workload.View();
  job.options = shape.options;
  job.output_dtype = DType::kFloat16;
  job.backend = BackendKind::kCpu;
  return job;
}

// A stream that sends a valid StartJob and then bytes that are not a CompressRequest: the
// server must end it with INVALID_ARGUMENT.
absl::StatusCode SendGarbage(grpc::GenericStub* stub, const Shape& shape, std::mt19937_64& rng) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub->PrepareCall(&context, "/centroidkv.v1.CentroidKV/Compress", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  v1::CompressRequest start;
  v1::StartJob* job = start.mutable_start_job();
  const LayerView view = shape.workload.View();
  job->set_job_id(1);
  job->set_num_heads(static_cast<uint32_t>(view.num_heads));
  job->set_num_tokens(static_cast<uint32_t>(view.num_tokens));
  job->set_key_dim(static_cast<uint32_t>(view.key_dim));
  job->set_value_dim(static_cast<uint32_t>(view.value_dim));
  job->set_dtype(v1::DTYPE_FLOAT16);
  std::string garbage(8 + rng() % 64, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  garbage[0] = '\x0f';  // field 1 with wire type 7: never a valid message
  for (const std::string& bytes : {start.SerializeAsString(), garbage}) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    if (!ok) break;
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer response;
  do {
    call->Read(&response, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
  } while (ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return static_cast<absl::StatusCode>(status.error_code());
}

// One client thread: until `until`, picks a behaviour and a shape and runs it.
void RunClient(int index, const Config& config, const std::vector<Shape>& shapes,
               client::Client* client, grpc::GenericStub* raw, Clock::time_point until,
               Tally* tally) {
  std::mt19937_64 rng(config.seed * 1000003 + static_cast<uint64_t>(index));
  // Mostly small jobs, a few large ones; 70% plain, the rest hostile.
  const int shape_weights[] = {40, 35, 18, 7};
  std::discrete_distribution<int> pick_shape(std::begin(shape_weights), std::end(shape_weights));
  const int behaviour_weights[] = {70, 10, 8, 7, 5};
  std::discrete_distribution<int> pick_behaviour(std::begin(behaviour_weights),
                                                 std::end(behaviour_weights));
  while (Clock::now() < until) {
    const auto behaviour = static_cast<Behaviour>(pick_behaviour(rng));
    const Shape& shape = shapes[static_cast<size_t>(pick_shape(rng))];
    tally->Iteration(behaviour);
    if (behaviour == Behaviour::kGarbage) {
      const absl::StatusCode code = SendGarbage(raw, shape, rng);
      tally->Status(behaviour, code, code == absl::StatusCode::kInvalidArgument, "garbage");
      continue;
    }
    std::unique_ptr<client::CompressStream> stream = client->OpenStream();
    client::LayerJob job = JobFor(shape);
    if (behaviour == Behaviour::kDeadline) job.timeout = std::chrono::milliseconds(1);
    const int jobs = behaviour == Behaviour::kNormal ? 1 + static_cast<int>(rng() % 3) : 1;
    std::vector<uint64_t> ids;
    for (int j = 0; j < jobs; ++j) {
      absl::StatusOr<uint64_t> id = stream->Submit(job);
      if (!id.ok()) {
        tally->Status(behaviour, id.status().code(), false, std::string(id.status().message()));
        break;
      }
      tally->Submitted();
      ids.push_back(*id);
    }
    if (behaviour == Behaviour::kCancel && !ids.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 50));
      (void)stream->Cancel(ids[0]);
      ids.clear();
      // The stream goes on: a tiny job after the cancelled one is answered.
      absl::StatusOr<uint64_t> id = stream->Submit(JobFor(shapes[0]));
      if (id.ok()) {
        tally->Submitted();
        ids.push_back(*id);
      }
    }
    if (behaviour == Behaviour::kDisconnect) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));
      stream->Abort();
      absl::StatusOr<client::LayerResult> result = stream->Next();
      // A result that beat the disconnect is fine (and checked); otherwise CANCELLED.
      if (result.ok() && result->status.ok()) {
        tally->Result(SameResult(*result, shape.expected));
      } else {
        const absl::Status status = result.ok() ? result->status : result.status();
        tally->Status(behaviour, status.code(),
                      status.code() == absl::StatusCode::kCancelled ||
                          status.code() == absl::StatusCode::kOutOfRange,
                      std::string(status.message()));
      }
      continue;
    }
    for (size_t j = 0; j < ids.size(); ++j) {
      absl::StatusOr<client::LayerResult> result = stream->Next();
      if (!result.ok()) {
        tally->Status(behaviour, result.status().code(), false,
                      std::string(result.status().message()));
        break;
      }
      if (!result->status.ok()) {
        // A 1 ms deadline passes before a job is done (unless it was tiny and fast).
        const bool expected = behaviour == Behaviour::kDeadline &&
                              result->status.code() == absl::StatusCode::kDeadlineExceeded;
        tally->Status(behaviour, result->status.code(), expected,
                      std::string(result->status.message()));
        continue;
      }
      const Shape& sent = behaviour == Behaviour::kCancel ? shapes[0] : shape;
      tally->Result(SameResult(*result, sent.expected));
    }
    const absl::Status closed = stream->Close();
    if (!closed.ok()) {
      tally->Status(behaviour, closed.code(), false, std::string(closed.message()));
    }
  }
}

int SoakMain(int argc, char** argv) {
  Config config;
  CLI::App app{"centroidkv-soak: hostile mixed load against a running server"};
  app.add_option("--target", config.target, "Server address")->capture_default_str();
  app.add_option("--server-pid", config.server_pid, "Server process whose RSS is sampled")
      ->required();
  app.add_option("--seconds", config.seconds, "How long to run")->capture_default_str();
  app.add_option("--streams", config.streams, "Client threads (one stream at a time each)")
      ->capture_default_str();
  app.add_option("--connections", config.connections, "Channels the streams share")
      ->capture_default_str();
  app.add_option("--seed", config.seed, "Data and behaviour seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::vector<Shape> shapes = MakeShapes(config.seed);
  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw;
  for (int c = 0; c < config.connections; ++c) {
    client::ClientOptions options;
    options.target = config.target;
    absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Connect(options);
    if (!client.ok()) {
      std::cerr << "soak: cannot connect to " << config.target << ": " << client.status() << "\n";
      return 2;
    }
    clients.push_back(*std::move(client));
    grpc::ChannelArguments args;
    args.SetInt("ckv.soak.connection", c);  // a connection of its own
    raw.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        config.target, grpc::InsecureChannelCredentials(), args)));
  }

  Tally tally;
  const auto start = Clock::now();
  const auto until = start + std::chrono::milliseconds(static_cast<int64_t>(config.seconds * 1000));
  std::vector<std::thread> threads;
  for (int i = 0; i < config.streams; ++i) {
    threads.emplace_back(RunClient, i, std::cref(config), std::cref(shapes),
                         clients[static_cast<size_t>(i % config.connections)].get(),
                         raw[static_cast<size_t>(i % config.connections)].get(), until, &tally);
  }
  uint64_t rss_min = UINT64_MAX, rss_max = 0, rss_after_minute = 0;
  std::vector<uint64_t> rss_max_per_window;  // the largest sample of each 10 s
  int samples = 0;
  while (Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const uint64_t rss = ResidentBytes(config.server_pid);
    if (rss == 0) {
      std::cerr << "soak: the server process " << config.server_pid << " is gone\n";
      break;
    }
    ++samples;
    rss_min = std::min(rss_min, rss);
    rss_max = std::max(rss_max, rss);
    const auto window = static_cast<size_t>((Clock::now() - start) / std::chrono::seconds(10));
    if (rss_max_per_window.size() <= window) rss_max_per_window.resize(window + 1, 0);
    rss_max_per_window[window] = std::max(rss_max_per_window[window], rss);
    if (rss_after_minute == 0 && Clock::now() - start >= std::chrono::minutes(1)) {
      rss_after_minute = rss;
    }
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << tally.Json(seconds, config, samples > 0 ? rss_min : 0, rss_max, rss_after_minute,
                          samples, rss_max_per_window)
            << std::endl;
  for (const std::string& line : tally.first_unexpected()) std::cerr << "unexpected: " << line << "\n";
  return tally.clean() && samples > 0 ? 0 : 1;
}

}  // namespace
}  // namespace centroidkv::bench

int main(int argc, char** argv) { return centroidkv::bench::SoakMain(argc, argv); }
