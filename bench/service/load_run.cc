// centroidkv-bench's runs (bench/service/load.h): the synthetic dataset, and the jobs sent
// through the service (one stream per worker thread) or an in-process engine on the
// server's executor, paced by tickets (a total or a duration, at a rate), recorded per job.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/service/load.h"
#include "bench/workload.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/client/shm_region.h"
#include "centroidkv/common/dtype.h"
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
  // Take() for a loop that keeps jobs in flight: the next ticket, or nullopt when none is
  // due yet (it may wait only when `in_flight` is 0) or none is left (then *more = false).
  std::optional<int64_t> TakeFor(size_t in_flight, bool* more) {
    const int64_t ticket = Take(/*may_wait=*/in_flight == 0);
    if (ticket == kOver) *more = false;
    if (ticket < 0) return std::nullopt;
    return ticket;
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

}  // namespace

LayerView Dataset::View(const LoadConfig& config, size_t layer) const {
  LayerView view{.dtype = config.dtype, .layout = TensorLayout::kHeadMajor,
      .num_heads = config.preset.kv_heads, .num_tokens = config.context,
      .key_dim = config.preset.head_dim, .value_dim = config.preset.head_dim,
      .keys = keys[layer % keys.size()].data(), .values = values[layer % values.size()].data()};
  if (IsFp8(config.dtype)) {
    view.key_scales = key_scales[layer % key_scales.size()];
    view.value_scales = value_scales[layer % value_scales.size()];
  }
  return view;
}

Dataset MakeDataset(const LoadConfig& config) {
  Dataset data;
  const int32_t layers = std::min(config.distinct_layers, config.preset.layers);
  const int64_t head_elements = int64_t{config.context} * config.preset.head_dim;
  auto convert = [&](const std::vector<uint16_t>& half, std::vector<std::vector<float>>* scales) {
    std::vector<uint8_t> out(half.size() * DTypeSize(config.dtype));
    std::vector<float> head_scales(static_cast<size_t>(config.preset.kv_heads), 1.0f);
    for (int32_t h = 0; h < config.preset.kv_heads; ++h) {
      const int64_t first = h * head_elements;
      std::vector<float> rows(static_cast<size_t>(head_elements));
      for (int64_t i = 0; i < head_elements; ++i) rows[i] = HalfToFloat(half[first + i]);
      if (IsFp8(config.dtype)) {
        head_scales[h] = Fp8ScaleFor(MaxMagnitude(rows.data(), head_elements), config.dtype);
        NarrowToFp8(rows.data(), head_elements, config.dtype, head_scales[h], out.data() + first);
      } else {
        StoreFromFloats(out.data(), config.dtype, first, head_elements, rows.data());
      }
    }
    scales->push_back(std::move(head_scales));
    return out;
  };
  for (int32_t l = 0; l < layers; ++l) {
    WorkloadSpec spec;
    spec.heads = config.preset.kv_heads;
    spec.tokens = config.context;
    spec.dim = config.preset.head_dim;
    spec.seed = config.seed + static_cast<uint64_t>(l) * 1000003u;
    Workload w = MakeWorkload(spec);
    data.keys.push_back(convert(w.keys, &data.key_scales));
    data.values.push_back(convert(w.values, &data.value_scales));
  }
  return data;
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
                    const ProgressFn& progress, bool shm) {
  RunStats stats;
  stats.concurrency = config.concurrency;
  stats.pipeline = config.pipeline;
  stats.label = absl::StrCat("service:", std::string(BackendKindName(backend)), shm ? "+shm" : "");
  const std::unique_ptr<client::Client> client = ConnectOrFail(config, &stats.fatal);
  if (client == nullptr) return stats;
  if (absl::StatusOr<client::ServerInfo> info = client->GetInfo(); info.ok()) {
    stats.threads = info->worker_threads;
  }
  // Shared memory: the dataset's layers copied once into one region (as a worker would keep
  // its KV there), and `pipeline` result slots per stream.
  std::unique_ptr<client::ShmLayerStack> stack;
  if (shm) {
    absl::StatusOr<std::unique_ptr<client::ShmLayerStack>> created = client::ShmLayerStack::Create(
        client.get(), data.View(config, 0), static_cast<int32_t>(data.keys.size()),
        config.options, config.output_dtype, config.concurrency * config.pipeline);
    if (!created.ok()) {
      stats.fatal = absl::StrCat(CodeName(created.status()), " ", created.status().message());
      return stats;
    }
    stack = *std::move(created);
    for (size_t l = 0; l < data.keys.size(); ++l) {
      stack->Fill(static_cast<int32_t>(l), data.View(config, l));
    }
  }
  std::atomic<int32_t> next_worker{0};
  auto loop = [&](Tickets& tickets, Clock::time_point start, std::atomic<int64_t>& done,
                  std::vector<JobRecord>* local, std::string* fatal) {
    std::unique_ptr<client::CompressStream> stream = client->OpenStream();
    // This stream's result slots (shm), free ones at the back.
    const int32_t worker = next_worker.fetch_add(1);
    std::vector<int32_t> free_slots;
    for (int32_t k = config.pipeline - 1; k >= 0; --k) {
      free_slots.push_back(worker * config.pipeline + k);
    }
    absl::flat_hash_map<uint64_t, int32_t> slot_of;
    absl::flat_hash_map<uint64_t, std::pair<Clock::time_point, int64_t>> in_flight;
    bool more = true;
    while (true) {
      while (more && static_cast<int32_t>(in_flight.size()) < config.pipeline) {
        // With jobs in flight, do not sleep for the next ticket's turn: their results
        // would wait unread and their latency would include the pacing.
        const std::optional<int64_t> next = tickets.TakeFor(in_flight.size(), &more);
        if (!next) break;
        const int64_t ticket = *next;
        client::LayerJob job;
        int32_t slot = -1;
        if (stack != nullptr) {
          slot = free_slots.back();
          free_slots.pop_back();
          const auto layer = static_cast<int32_t>(static_cast<size_t>(ticket) % data.keys.size());
          job = stack->Job(layer, slot);
          job.layer.key_scales = data.View(config, static_cast<size_t>(layer)).key_scales;
          job.layer.value_scales = data.View(config, static_cast<size_t>(layer)).value_scales;
        } else {
          job.layer = data.View(config, static_cast<size_t>(ticket));
          job.options = config.options;
          job.output_dtype = config.output_dtype;
        }
        job.layer_index = static_cast<uint32_t>(ticket % config.preset.layers);
        job.backend = backend;
        const Clock::time_point sent = Clock::now();
        absl::StatusOr<uint64_t> id = stream->Submit(job);
        if (id.ok() && slot >= 0) slot_of[*id] = slot;
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
      if (auto slot = slot_of.find(result->job_id); slot != slot_of.end()) {
        free_slots.push_back(slot->second);  // its result has been read (here: not at all)
        slot_of.erase(slot);
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
  stats.concurrency = config.concurrency;
  stats.pipeline = config.pipeline;
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
  // The job the server runs: rows in the output dtype where the engine writes it (the server
  // asks for that too, compress_reactor.cc), into a result kept across jobs (the server's
  // ResultPool; here one per executor thread).
  CompressOptions options = config.options;
  const DType output_dtype = config.output_dtype.value_or(config.dtype);
  if ((*engine)->caps().WritesResultDType(output_dtype) || IsFp8(output_dtype)) {
    options.result_dtype = output_dtype;  // fp8: the server's codec always asks for it
  }
  auto loop = [&](Tickets& tickets, Clock::time_point /*start*/, std::atomic<int64_t>& done,
                  std::vector<JobRecord>* local, std::string* /*fatal*/) {
    // Like a stream: up to config.pipeline jobs in flight, results taken oldest first.
    std::deque<std::future<JobRecord>> in_flight;
    bool more = true;
    while (true) {
      while (more && static_cast<int32_t>(in_flight.size()) < config.pipeline) {
        const std::optional<int64_t> next = tickets.TakeFor(in_flight.size(), &more);
        if (!next) break;
        const int64_t ticket = *next;
        auto task = std::make_shared<std::promise<JobRecord>>();
        in_flight.push_back(task->get_future());
        const Clock::time_point sent = Clock::now();
        executor.Submit([&, task, ticket, sent] {
          const Clock::time_point began = Clock::now();
          thread_local CompressResult result;
          const absl::Status status = (*engine)->CompressInto(
              data.View(config, static_cast<size_t>(ticket)), options, &result);
          const Clock::time_point finished = Clock::now();
          task->set_value(MakeRecord(config, Seconds(finished - sent), CodeName(status),
                                     status.ok() ? result.total_entries() : 0,
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

}  // namespace centroidkv::bench
