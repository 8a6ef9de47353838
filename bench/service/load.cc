#include "bench/service/load.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/workload.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/types/kinds.h"
#include "service/executor.h"

namespace centroidkv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string CodeName(const absl::Status& status) {
  return absl::StatusCodeToString(status.code());
}

// Hands out job tickets: a fixed total or a duration, paced to a rate when one is set.
class Tickets {
 public:
  Tickets(const LoadConfig& config, Clock::time_point start)
      : config_(config), start_(start),
        end_(start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(config.duration_s))) {}

  static constexpr int64_t kOver = -1;
  static constexpr int64_t kNotYet = -2;

  // The next ticket, or kOver when the run is over. Under --rate, a ticket whose turn has
  // not come is kNotYet when `may_wait` is false (the caller has results to read first);
  // otherwise this sleeps until its turn.
  int64_t Take(bool may_wait = true) {
    while (true) {
      if (config_.jobs == 0 && Clock::now() >= end_) return kOver;
      int64_t ticket = next_.load();
      if (config_.jobs > 0 && ticket >= config_.jobs) return kOver;
      Clock::time_point due = start_;
      if (config_.rate > 0) {
        due = start_ + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(ticket / config_.rate));
        if (config_.jobs == 0 && due >= end_) return kOver;
        if (!may_wait && due > Clock::now()) return kNotYet;
      }
      if (!next_.compare_exchange_weak(ticket, ticket + 1)) continue;
      if (config_.rate > 0) std::this_thread::sleep_until(due);
      return ticket;
    }
  }
  int64_t total() const { return config_.jobs > 0 ? config_.jobs : -1; }

 private:
  const LoadConfig& config_;
  Clock::time_point start_;
  Clock::time_point end_;
  std::atomic<int64_t> next_{0};
};

// Calls `progress` every 200 ms from a thread of its own until destroyed.
class ProgressTicker {
 public:
  ProgressTicker(const ProgressFn& progress, const std::atomic<int64_t>* done, int64_t total,
                 Clock::time_point start)
      : progress_(progress), done_(done), total_(total), start_(start) {
    if (progress_) thread_ = std::thread([this] { Loop(); });
  }
  ~ProgressTicker() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (progress_) progress_(done_->load(), -2, Seconds(Clock::now() - start_));  // final
  }

 private:
  void Loop() {
    while (!stop_.load()) {
      progress_(done_->load(), total_, Seconds(Clock::now() - start_));
      for (int i = 0; i < 20 && !stop_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  ProgressFn progress_;
  const std::atomic<int64_t>* done_;
  int64_t total_;
  Clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The kind `name` spells in `table` (types/kinds.h), or an error naming the flag.
template <typename Kind>
absl::StatusOr<Kind> ParseFlag(std::span<const KindName<Kind>> table, const std::string& name,
                               const char* flag) {
  std::optional<Kind> kind = ParseKind<Kind>(table, name);
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", name, "' is not one of ", KindNameList(table)));
  }
  return *kind;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = {
      {"llama3-8b", 32, 8, 128},
      {"qwen2.5-7b", 28, 4, 128},
      {"llama3-70b", 80, 8, 128},
  };
  return presets;
}

absl::StatusOr<ModelPreset> FindPreset(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelPreset& preset : ModelPresets()) {
    if (preset.name == name) return preset;
    names.push_back(preset.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("--preset: unknown preset '", name,
                                                 "'; known: ", absl::StrJoin(names, ", ")));
}

int64_t LoadConfig::BytesPerJob() const {
  return 2 * TokensPerJob() * preset.head_dim * static_cast<int64_t>(DTypeSize(dtype));
}

void AddLoadFlags(CLI::App* app, LoadFlags* flags) {
  LoadConfig& c = flags->config;
  app->add_option("--server", c.server,
                  "Server address (HOST:PORT or unix:///path), or replicas to balance over: "
                  "HOST:PORT,HOST:PORT,... or dns:///NAME:PORT")
      ->capture_default_str();
  app->add_option("--concurrency,-c", c.concurrency, "Streams (threads in-process)")
      ->capture_default_str();
  app->add_option("--pipeline", c.pipeline, "Jobs in flight per stream")->capture_default_str();
  auto* jobs = app->add_option("--jobs,-n", c.jobs, "Total layer jobs (default: one sequence, "
                                                    "i.e. the preset's layer count)");
  app->add_option("--duration", c.duration_s, "Run for this many seconds instead of --jobs")
      ->excludes(jobs);
  app->add_option("--rate", c.rate, "Jobs per second over all streams; 0 = as fast as possible")
      ->capture_default_str();
  app->add_option("--preset", flags->preset, "llama3-8b | qwen2.5-7b | llama3-70b")
      ->capture_default_str();
  app->add_option("--context", c.context, "Tokens per head (context length)")
      ->capture_default_str();
  app->add_option("--dtype", flags->dtype, "float16 | float32 | bfloat16")->capture_default_str();
  app->add_option("--seed", c.seed, "Seed of the synthetic clustered KV")->capture_default_str();
  app->add_option("--distinct-layers", c.distinct_layers,
                  "Distinct layers of data generated (reused round-robin)")
      ->capture_default_str();
  // SPEC parameters, named as in `centroidkv compress`.
  flags->target_ratio_flag =
      app->add_option("--target-ratio", flags->target_ratio, "rho in (0, 1]: keep ceil(rho * n)")
          ->capture_default_str();
  flags->target_tokens_flag =
      app->add_option("--target-tokens", flags->target_tokens, "Absolute target length t");
  app->add_option("--chunk-size", c.options.chunk_size, "Chunk size C >= 2")
      ->capture_default_str();
  app->add_option("--sink-tokens", c.options.sink_tokens, "Leading entries never merged")
      ->capture_default_str();
  app->add_option("--recent-tokens", c.options.recent_tokens, "Trailing entries never merged")
      ->capture_default_str();
  flags->min_similarity_flag = app->add_option(
      "--min-similarity", flags->min_similarity, "Similarity floor tau in [-1, 1] (default off)");
  app->add_option("--tighten-per-pass", c.options.tighten_per_pass, "Floor increase per pass")
      ->capture_default_str();
  app->add_option("--max-passes", c.options.max_passes, "Passes P >= 1")->capture_default_str();
  app->add_option("--uniform-heads", flags->uniform_heads,
                  "true: every compressed head ends with the same length")
      ->capture_default_str();
  app->add_option("--passthrough-heads", flags->passthrough_heads,
                  "Heads returned unchanged, e.g. 1,3")
      ->delimiter(',');
  app->add_option("--output-dtype", flags->output_dtype, "input (default), or a dtype: float32, float16, bfloat16 (fp32, fp16, bf16)")
      ->capture_default_str();
  app->add_option("--assignment", flags->assignment,
                  "Ask for the assignment (true/false; off by default here)")
      ->capture_default_str();
  app->add_option("--backend", flags->backend, "auto | cpu | cuda (gpu) | reference | identity")
      ->capture_default_str();
  client::AddSecurityFlags(app, &c.security);
  app->add_option("--slab-kib", c.slab_kib, "Slab size sent to the server, KiB")
      ->capture_default_str();
  app->add_option("--threads", c.threads,
                  "Clustering threads of the in-process engine (--compare); 0 = the server's")
      ->capture_default_str();
  app->add_option("--connect-timeout", c.connect_timeout_s,
                  "Seconds to wait for the server to become ready")
      ->capture_default_str();
  app->add_flag("--compare", c.compare,
                "Run service (cpu), transport floor (identity: a real job's bytes, no "
                "clustering) and in-process cpu side by side");
  app->add_option("--rounds", c.rounds,
                  "--compare: rounds of the three runs in turn; medians are reported")
      ->capture_default_str();
  app->add_option("--format", c.format, "text | json | csv")->capture_default_str();
  app->add_flag("--progress", c.progress, "Show the progress bar even when stderr is no tty");
  app->add_flag("--quiet,-q", c.quiet, "No progress bar");
}

// "--flag: 5000 is not in [1, 1024]", with an optional note after the range.
absl::Status CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi,
                        const char* note = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", value, " is not in [", lo, ", ",
                                                 hi, "]", *note != '\0' ? " " : "", note));
}

absl::StatusOr<LoadConfig> FinishConfig(LoadFlags& flags) {
  LoadConfig config = flags.config;
  absl::StatusOr<ModelPreset> preset = FindPreset(flags.preset);
  if (!preset.ok()) return preset.status();
  config.preset = *preset;
  CKV_ASSIGN_OR_RETURN(config.dtype, ParseFlag<DType>(kDTypeNames, flags.dtype, "--dtype"));
  if (flags.output_dtype == "input") {
    config.output_dtype.reset();
  } else {
    CKV_ASSIGN_OR_RETURN(config.output_dtype,
                         ParseFlag<DType>(kDTypeNames, flags.output_dtype, "--output-dtype"));
  }
  CKV_ASSIGN_OR_RETURN(config.backend,
                       ParseFlag<BackendKind>(kBackendKindNames, flags.backend, "--backend"));
  if (config.format != "text" && config.format != "json" && config.format != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: '", config.format, "' is not text, json or csv"));
  }
  CKV_RETURN_IF_ERROR(CheckRange("--concurrency", config.concurrency, 1, 1024));
  CKV_RETURN_IF_ERROR(CheckRange("--pipeline", config.pipeline, 1, 64));
  if (config.jobs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs: ", config.jobs, " is negative"));
  }
  if (!(config.duration_s >= 0) || !std::isfinite(config.duration_s)) {
    return absl::InvalidArgumentError("--duration: must be a finite number of seconds >= 0");
  }
  if (config.jobs > 0 && config.duration_s > 0) {
    return absl::InvalidArgumentError("--jobs and --duration exclude each other");
  }
  if (config.jobs == 0 && config.duration_s == 0) config.jobs = config.preset.layers;
  if (!(config.rate >= 0) || !std::isfinite(config.rate)) {
    return absl::InvalidArgumentError("--rate: must be >= 0 jobs per second (0: unlimited)");
  }
  if (config.context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context: ", config.context, " tokens; needs at least 1"));
  }
  if (!(config.connect_timeout_s > 0) || !std::isfinite(config.connect_timeout_s)) {
    return absl::InvalidArgumentError("--connect-timeout: must be > 0 seconds");
  }
  if (config.distinct_layers < 1) {
    return absl::InvalidArgumentError("--distinct-layers: needs at least 1");
  }
  CKV_RETURN_IF_ERROR(CheckRange("--rounds", config.rounds, 1, 100));
  CKV_RETURN_IF_ERROR(CheckRange("--threads", config.threads, 0, 1024, "(0: the server's)"));
  CKV_RETURN_IF_ERROR(CheckRange("--slab-kib", config.slab_kib, 4, 4096));
  auto* target_tokens_flag = static_cast<CLI::Option*>(flags.target_tokens_flag);
  auto* target_ratio_flag = static_cast<CLI::Option*>(flags.target_ratio_flag);
  auto* min_similarity_flag = static_cast<CLI::Option*>(flags.min_similarity_flag);
  if (target_tokens_flag != nullptr && target_tokens_flag->count() > 0) {
    if (target_ratio_flag != nullptr && target_ratio_flag->count() > 0) {
      return absl::InvalidArgumentError("--target-ratio and --target-tokens exclude each other");
    }
    config.options.target_tokens = flags.target_tokens;
  } else {
    config.options.target_ratio = flags.target_ratio;
  }
  if (min_similarity_flag != nullptr && min_similarity_flag->count() > 0) {
    config.options.min_similarity = flags.min_similarity;
  }
  config.options.uniform_heads = flags.uniform_heads;
  config.options.passthrough_heads = flags.passthrough_heads;
  config.options.compute_assignment = flags.assignment;
  if (config.compare) config.backend = BackendKind::kCpu;
  // The engine's own checks, on the shape alone: the same messages the server would send.
  LayerView shape;
  shape.dtype = config.dtype;
  shape.num_heads = config.preset.kv_heads;
  shape.num_tokens = config.context;
  shape.key_dim = config.preset.head_dim;
  shape.value_dim = config.preset.head_dim;
  absl::Status valid = ValidateJobShape(shape, config.options, EngineLimits{});
  if (!valid.ok()) return valid;
  return config;
}

absl::StatusOr<LoadConfig> ParseLoadArgs(const std::vector<std::string>& args) {
  CLI::App app("centroidkv-bench");
  LoadFlags flags;
  AddLoadFlags(&app, &flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return FinishConfig(flags);
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  q = std::clamp(q, 0.0, 1.0);
  const double rank = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

LayerView Dataset::View(const LoadConfig& config, size_t layer) const {
  LayerView view;
  view.dtype = config.dtype;
  view.layout = TensorLayout::kHeadMajor;
  view.num_heads = config.preset.kv_heads;
  view.num_tokens = config.context;
  view.key_dim = config.preset.head_dim;
  view.value_dim = config.preset.head_dim;
  view.keys = keys[layer % keys.size()].data();
  view.values = values[layer % values.size()].data();
  return view;
}

Dataset MakeDataset(const LoadConfig& config) {
  Dataset data;
  const int32_t layers = std::min(config.distinct_layers, config.preset.layers);
  auto convert = [&](const std::vector<uint16_t>& half) {
    std::vector<uint8_t> out(half.size() * DTypeSize(config.dtype));
    for (size_t i = 0; i < half.size(); ++i) {
      StoreFromFloat(out.data(), config.dtype, static_cast<int64_t>(i), HalfToFloat(half[i]));
    }
    return out;
  };
  for (int32_t l = 0; l < layers; ++l) {
    WorkloadSpec spec;
    spec.heads = config.preset.kv_heads;
    spec.tokens = config.context;
    spec.dim = config.preset.head_dim;
    spec.seed = config.seed + static_cast<uint64_t>(l) * 1000003u;
    Workload w = MakeWorkload(spec);
    data.keys.push_back(convert(w.keys));
    data.values.push_back(convert(w.values));
  }
  return data;
}

int64_t RunStats::jobs_ok() const {
  return std::count_if(records.begin(), records.end(),
                       [](const JobRecord& r) { return r.code == "OK"; });
}
int64_t RunStats::jobs_failed() const {
  return static_cast<int64_t>(records.size()) - jobs_ok();
}
std::map<std::string, int64_t> RunStats::errors() const {
  std::map<std::string, int64_t> errors;
  for (const JobRecord& r : records) {
    if (r.code != "OK") ++errors[r.code];
  }
  if (!fatal.empty()) ++errors["STREAM: " + fatal];
  return errors;
}
double RunStats::tokens_per_s() const {
  int64_t tokens = 0;
  for (const JobRecord& r : records) tokens += r.code == "OK" ? r.entries_in : 0;
  return wall_s > 0 ? static_cast<double>(tokens) / wall_s : 0.0;
}
double RunStats::gb_per_s() const {
  int64_t bytes = 0;
  for (const JobRecord& r : records) bytes += r.code == "OK" ? r.bytes_in : 0;
  return wall_s > 0 ? static_cast<double>(bytes) / wall_s / 1e9 : 0.0;
}
double RunStats::compression() const {
  int64_t in = 0, out = 0;
  for (const JobRecord& r : records) {
    if (r.code != "OK") continue;
    in += r.entries_in;
    out += r.entries_out;
  }
  return in > 0 ? static_cast<double>(out) / static_cast<double>(in) : 0.0;
}
namespace {
// Mean of `field` over the OK records, in ms.
double MeanMs(const std::vector<JobRecord>& records, double JobRecord::*field) {
  double sum = 0.0;
  int64_t n = 0;
  for (const JobRecord& r : records) {
    if (r.code != "OK") continue;
    sum += r.*field;
    ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) * 1e3 : 0.0;
}
}  // namespace
double RunStats::mean_latency_ms() const { return MeanMs(records, &JobRecord::latency_s); }
double RunStats::mean_queue_ms() const { return MeanMs(records, &JobRecord::queue_s); }
double RunStats::mean_compute_ms() const { return MeanMs(records, &JobRecord::compute_s); }
double RunStats::latency_ms(double q) const {
  std::vector<double> ms;
  for (const JobRecord& r : records) {
    if (r.code == "OK") ms.push_back(r.latency_s * 1e3);
  }
  return Percentile(std::move(ms), q);
}

namespace {

JobRecord MakeRecord(const LoadConfig& config, double latency_s, std::string code,
                     int64_t entries_out, double queue_s = 0.0, double compute_s = 0.0) {
  return JobRecord{latency_s,           std::move(code),       config.TokensPerJob(),
                   entries_out,         config.BytesPerJob(),  queue_s,
                   compute_s};
}

std::unique_ptr<client::Client> ConnectOrFail(const LoadConfig& config, std::string* fatal) {
  client::ClientOptions options;
  options.target = config.server;
  options.slab_bytes = config.slab_kib << 10;
  client::ApplySecurityFlags(config.security, &options);
  options.connect_timeout = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(config.connect_timeout_s * 1e3)));
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::ConnectTarget(options);
  if (!client.ok()) {
    *fatal = absl::StrCat(CodeName(client.status()), " ", client.status().message());
    return nullptr;
  }
  return std::move(*client);
}

// One job loop per worker thread (config.concurrency of them), sharing the tickets and the
// progress ticker. `loop` fills its records and may set a fatal message; the pool merges
// both into `stats` and sets the wall time.
using WorkerLoop = std::function<void(Tickets& tickets, Clock::time_point start,
                                      std::atomic<int64_t>& done,
                                      std::vector<JobRecord>* records, std::string* fatal)>;

void RunWorkerPool(const LoadConfig& config, const ProgressFn& progress, const WorkerLoop& loop,
                   RunStats* stats) {
  std::mutex mu;
  std::atomic<int64_t> done{0};
  const Clock::time_point start = Clock::now();
  Tickets tickets(config, start);
  {
    ProgressTicker ticker(progress, &done, tickets.total(), start);
    std::vector<std::thread> workers;
    for (int32_t w = 0; w < config.concurrency; ++w) {
      workers.emplace_back([&] {
        std::vector<JobRecord> local;
        std::string fatal;
        loop(tickets, start, done, &local, &fatal);
        std::lock_guard<std::mutex> lock(mu);
        stats->records.insert(stats->records.end(), local.begin(), local.end());
        if (!fatal.empty() && stats->fatal.empty()) stats->fatal = fatal;
      });
    }
    for (std::thread& t : workers) t.join();
  }
  stats->wall_s = Seconds(Clock::now() - start);
}

}  // namespace

RunStats RunService(const LoadConfig& config, const Dataset& data, BackendKind backend,
                    const ProgressFn& progress) {
  RunStats stats;
  stats.label = absl::StrCat("service:", std::string(BackendKindName(backend)));
  const std::unique_ptr<client::Client> client = ConnectOrFail(config, &stats.fatal);
  if (client == nullptr) return stats;
  if (absl::StatusOr<client::ServerInfo> info = client->GetInfo(); info.ok()) {
    stats.threads = info->worker_threads;
  }
  auto loop = [&](Tickets& tickets, Clock::time_point start, std::atomic<int64_t>& done,
                  std::vector<JobRecord>* local, std::string* fatal) {
    std::unique_ptr<client::CompressStream> stream = client->OpenStream();
    absl::flat_hash_map<uint64_t, std::pair<Clock::time_point, int64_t>> in_flight;
    bool more = true;
    while (true) {
      while (more && static_cast<int32_t>(in_flight.size()) < config.pipeline) {
        // With jobs in flight, do not sleep for the next ticket's turn: their results
        // would wait unread and their latency would include the pacing.
        const int64_t ticket = tickets.Take(/*may_wait=*/in_flight.empty());
        if (ticket == Tickets::kNotYet) break;
        if (ticket < 0) {
          more = false;
          break;
        }
        client::LayerJob job;
        job.layer_index = static_cast<uint32_t>(ticket % config.preset.layers);
        job.layer = data.View(config, static_cast<size_t>(ticket));
        job.options = config.options;
        job.output_dtype = config.output_dtype;
        job.backend = backend;
        const Clock::time_point sent = Clock::now();
        absl::StatusOr<uint64_t> id = stream->Submit(job);
        if (!id.ok()) {
          *fatal = absl::StrCat(CodeName(id.status()), " ", id.status().message());
          more = false;
          break;
        }
        in_flight[*id] = {sent, ticket};
      }
      if (in_flight.empty()) break;
      absl::StatusOr<client::LayerResult> result = stream->Next();
      if (!result.ok()) {
        *fatal = absl::StrCat(CodeName(result.status()), " ", result.status().message());
        for (size_t i = 0; i < in_flight.size(); ++i) {
          local->push_back(MakeRecord(config, 0.0, CodeName(result.status()), 0));
        }
        in_flight.clear();
        break;
      }
      auto it = in_flight.find(result->job_id);
      const Clock::time_point sent = it != in_flight.end() ? it->second.first : start;
      if (it != in_flight.end()) in_flight.erase(it);
      local->push_back(MakeRecord(config, Seconds(Clock::now() - sent),
                                  CodeName(result->status), result->total_entries(),
                                  result->queue_seconds, result->compute_seconds));
      done.fetch_add(1);
    }
    absl::Status closed = fatal->empty() ? stream->Close() : absl::OkStatus();
    if (fatal->empty() && !closed.ok()) {
      *fatal = absl::StrCat(CodeName(closed), " ", closed.message());
    }
    if (!fatal->empty()) stream->Abort();
  };
  RunWorkerPool(config, progress, loop, &stats);
  return stats;
}

int32_t ServerThreads(const LoadConfig& config) {
  std::string fatal;
  const std::unique_ptr<client::Client> client = ConnectOrFail(config, &fatal);
  if (client == nullptr) return 0;
  absl::StatusOr<client::ServerInfo> info = client->GetInfo();
  return info.ok() ? info->worker_threads : 0;
}

RunStats RunInProcess(const LoadConfig& config, const Dataset& data, BackendKind backend,
                      int32_t threads, const ProgressFn& progress) {
  RunStats stats;
  stats.label = absl::StrCat("in-process:", std::string(BackendKindName(backend)));
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(backend);
  if (!engine.ok()) {
    stats.fatal = absl::StrCat(CodeName(engine.status()), " ", engine.status().message());
    return stats;
  }
  // The server's executor: the engine runs on the same number of threads, scheduled the
  // same way, as it does behind the service.
  service::WorkExecutor executor(threads);
  stats.threads = executor.threads();
  auto loop = [&](Tickets& tickets, Clock::time_point /*start*/, std::atomic<int64_t>& done,
                  std::vector<JobRecord>* local, std::string* /*fatal*/) {
    // Like a stream: up to config.pipeline jobs in flight, results taken oldest first.
    std::deque<std::future<JobRecord>> in_flight;
    bool more = true;
    while (true) {
      while (more && static_cast<int32_t>(in_flight.size()) < config.pipeline) {
        const int64_t ticket = tickets.Take(/*may_wait=*/in_flight.empty());
        if (ticket == Tickets::kNotYet) break;
        if (ticket < 0) {
          more = false;
          break;
        }
        auto task = std::make_shared<std::promise<JobRecord>>();
        in_flight.push_back(task->get_future());
        const Clock::time_point sent = Clock::now();
        executor.Submit([&, task, ticket, sent] {
          const Clock::time_point began = Clock::now();
          absl::StatusOr<CompressResult> result = (*engine)->Compress(
              data.View(config, static_cast<size_t>(ticket)), config.options);
          const Clock::time_point finished = Clock::now();
          task->set_value(MakeRecord(config, Seconds(finished - sent), CodeName(result.status()),
                                     result.ok() ? result->total_entries() : 0,
                                     Seconds(began - sent), Seconds(finished - began)));
        });
      }
      if (in_flight.empty()) break;
      local->push_back(in_flight.front().get());
      in_flight.pop_front();
      done.fetch_add(1);
    }
  };
  RunWorkerPool(config, progress, loop, &stats);
  return stats;
}

void PrintStats(const LoadConfig& config, const std::vector<RunStats>& runs, std::ostream& out) {
  if (config.format == "json") {
    for (const RunStats& s : runs) {
      std::vector<std::string> errors;
      for (const auto& [code, count] : s.errors()) {
        errors.push_back(absl::StrCat(JsonString(code), ":", count));
      }
      out << absl::StrFormat(
                 "{\"run\":%s,\"preset\":%s,\"context\":%d,\"dtype\":%s,\"concurrency\":%d,"
                 "\"pipeline\":%d,\"threads\":%d,\"jobs\":%d,\"jobs_failed\":%d,"
                 "\"wall_s\":%.4f,\"tokens_per_s\":%.1f,\"gb_per_s\":%.4f,"
                 "\"compression\":%.5f,\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,"
                 "\"p99\":%.3f,\"mean\":%.3f},\"queue_ms_mean\":%.3f,"
                 "\"compute_ms_mean\":%.3f,\"errors\":{%s}}",
                 JsonString(s.label), JsonString(config.preset.name), config.context,
                 JsonString(std::string(DTypeName(config.dtype))), config.concurrency,
                 config.pipeline, s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
                 s.tokens_per_s(), s.gb_per_s(), s.compression(), s.latency_ms(0.5),
                 s.latency_ms(0.9), s.latency_ms(0.99), s.mean_latency_ms(), s.mean_queue_ms(),
                 s.mean_compute_ms(), absl::StrJoin(errors, ","))
          << "\n";
    }
    return;
  }
  if (config.format == "csv") {
    out << "run,preset,context,dtype,concurrency,pipeline,threads,jobs,jobs_failed,wall_s,"
           "tokens_per_s,gb_per_s,compression,p50_ms,p90_ms,p99_ms,mean_ms,queue_ms_mean,"
           "compute_ms_mean,errors\n";
    for (const RunStats& s : runs) {
      std::vector<std::string> errors;
      for (const auto& [code, count] : s.errors()) errors.push_back(absl::StrCat(code, "=", count));
      out << absl::StrFormat(
          "%s,%s,%d,%s,%d,%d,%d,%d,%d,%.4f,%.1f,%.4f,%.5f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,\"%s\"\n",
          s.label, config.preset.name, config.context, std::string(DTypeName(config.dtype)),
          config.concurrency, config.pipeline, s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
          s.tokens_per_s(), s.gb_per_s(), s.compression(), s.latency_ms(0.5), s.latency_ms(0.9),
          s.latency_ms(0.99), s.mean_latency_ms(), s.mean_queue_ms(), s.mean_compute_ms(),
          absl::StrJoin(errors, ";"));
    }
    return;
  }
  for (const RunStats& s : runs) {
    out << absl::StrFormat(
        "%s  (%s: %d x %d heads x %d, context %d, %s, concurrency %d x %d in flight, "
        "%d clustering threads)\n"
        "  jobs:          %d ok, %d failed in %.3f s\n"
        "  throughput:    %.4g layer-head tokens/s, %.3f GB/s of KV in\n"
        "  compression:   %.4f entries out / in\n"
        "  latency/job:   p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  mean %.2f ms\n"
        "  of which:      queue %.2f ms + compute %.2f ms (means; the rest is transport)\n",
        s.label, config.preset.name, config.preset.layers, config.preset.kv_heads,
        config.preset.head_dim, config.context, std::string(DTypeName(config.dtype)),
        config.concurrency, config.pipeline, s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
        s.tokens_per_s(), s.gb_per_s(), s.compression(), s.latency_ms(0.5), s.latency_ms(0.9),
        s.latency_ms(0.99), s.mean_latency_ms(), s.mean_queue_ms(), s.mean_compute_ms());
    const auto errors = s.errors();
    if (errors.empty()) {
      out << "  errors:        none\n";
    } else {
      for (const auto& [code, count] : errors) {
        out << absl::StrFormat("  errors:        %d x %s\n", count, code);
      }
    }
  }
}

namespace {
double SerialBound(double floor, double in_process) {
  return (floor > 0 && in_process > 0) ? 1.0 / (1.0 / floor + 1.0 / in_process) : 0.0;
}
double MedianTokensPerS(const std::vector<RunStats>& runs) {
  std::vector<double> rates;
  for (const RunStats& run : runs) rates.push_back(run.tokens_per_s());
  return Percentile(std::move(rates), 0.5);
}
}  // namespace

std::string CompareJson(const LoadConfig& config, const std::vector<RunStats>& service,
                        const std::vector<RunStats>& floor,
                        const std::vector<RunStats>& in_process) {
  const double s = MedianTokensPerS(service);
  const double f = MedianTokensPerS(floor);
  const double p = MedianTokensPerS(in_process);
  const double bound = SerialBound(f, p);
  const double ratio = bound > 0 ? s / bound : 0.0;
  std::vector<std::string> per_round;
  const size_t rounds = std::min({service.size(), floor.size(), in_process.size()});
  for (size_t r = 0; r < rounds; ++r) {
    const double b = SerialBound(floor[r].tokens_per_s(), in_process[r].tokens_per_s());
    per_round.push_back(absl::StrFormat("%.4f", b > 0 ? service[r].tokens_per_s() / b : 0.0));
  }
  return absl::StrFormat(
      "{\"preset\":%s,\"context\":%d,\"concurrency\":%d,\"pipeline\":%d,"
      "\"server_threads\":%d,\"in_process_threads\":%d,\"rounds\":%d,"
      "\"service_tokens_per_s\":%.1f,\"floor_tokens_per_s\":%.1f,"
      "\"in_process_tokens_per_s\":%.1f,\"serial_bound_tokens_per_s\":%.1f,"
      "\"ratio_to_serial_bound\":%.4f,\"ratio_per_round\":[%s]}",
      JsonString(config.preset.name), config.context, config.concurrency, config.pipeline,
      service.empty() ? 0 : service[0].threads, in_process.empty() ? 0 : in_process[0].threads,
      rounds, s, f, p, bound, ratio, absl::StrJoin(per_round, ","));
}

int BenchMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app("centroidkv-bench: load generator for the CentroidKV service", "centroidkv-bench");
  LoadFlags flags;
  AddLoadFlags(&app, &flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err);
  }
  absl::StatusOr<LoadConfig> config = FinishConfig(flags);
  if (!config.ok()) {
    err << "centroidkv-bench: " << config.status().message() << "\n";
    return 2;
  }
  const bool show = !config->quiet && (config->progress || isatty(STDERR_FILENO) == 1);
  // A progress bar on stderr for the run named `label`, or none.
  auto progress = [&err, show](std::string label) -> ProgressFn {
    if (!show) return nullptr;
    return [&err, label](int64_t done, int64_t total, double elapsed) {
      if (total == -2) {
        err << "\r\033[K" << std::flush;
        return;
      }
      constexpr int kWidth = 30;
      std::string line;
      if (total > 0) {
        const int filled = static_cast<int>(kWidth * std::min<double>(1.0, 1.0 * done / total));
        line = absl::StrFormat("\r%s [%s%s] %d/%d jobs  %.1f s", label, std::string(filled, '#'),
                               std::string(kWidth - filled, ' '), done, total, elapsed);
      } else {
        line = absl::StrFormat("\r%s %d jobs  %.1f s", label, done, elapsed);
      }
      err << line << std::flush;
    };
  };
  if (show) err << "generating " << config->distinct_layers << " layers of synthetic KV...\n";
  const Dataset data = MakeDataset(*config);
  std::vector<RunStats> runs;
  std::vector<RunStats> service, floor, in_process;
  if (config->compare) {
    // The in-process engine gets the server's clustering threads unless --threads says.
    const int32_t threads = config->threads > 0 ? config->threads : ServerThreads(*config);
    // Rounds of the three legs in turn, so that a change in the machine's load falls on
    // all three; the JSON line takes each leg's median over the rounds.
    for (int32_t round = 1; round <= config->rounds; ++round) {
      const std::string tag = config->rounds > 1 ? absl::StrCat(" #", round) : "";
      service.push_back(
          RunService(*config, data, BackendKind::kCpu, progress("service:cpu" + tag)));
      floor.push_back(RunService(*config, data, BackendKind::kIdentity,
                                 progress("service:identity" + tag)));
      in_process.push_back(RunInProcess(*config, data, BackendKind::kCpu, threads,
                                        progress("in-process:cpu" + tag)));
      for (RunStats* run : {&service.back(), &floor.back(), &in_process.back()}) {
        run->label += tag;
        runs.push_back(*run);
      }
    }
  } else {
    runs.push_back(RunService(*config, data, config->backend,
                              progress(absl::StrCat("service:",
                                                    std::string(BackendKindName(config->backend))))));
  }
  PrintStats(*config, runs, out);
  if (config->compare) out << CompareJson(*config, service, floor, in_process) << "\n";
  for (const RunStats& run : runs) {
    if (run.jobs_failed() > 0 || !run.fatal.empty() || run.records.empty()) return 1;
  }
  return 0;
}

}  // namespace centroidkv::bench
