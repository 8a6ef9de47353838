// centroidkv-bench: a load generator for the CentroidKV service in the spirit of ghz.
// Concurrency (streams), a total of jobs or a duration, a request rate, workload presets
// named after real models' KV shapes, every SPEC parameter, and a summary (throughput,
// compression, latency percentiles, the server's queue and compute time per job, errors by
// status code). --compare runs the service with the cpu backend, the transport floor
// (identity backend, same server: a real job's bytes in and out, no clustering) and the
// in-process CPU engine (on an executor of the server's thread count) side by side on the
// same data.
//
// The pieces are functions so that tests can drive them without main(). Flags and presets
// are defined in load_flags.cc, the dataset and the runs in load_run.cc, the statistics and
// the printed report in load_report.cc, BenchMain (flags, run, report) in load.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/engine_factory.h"
#include "client/cli/security_flags.h"

namespace CLI {
class App;
}

namespace centroidkv::bench {

struct ModelPreset {
  std::string name;
  int32_t layers = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
};

// llama3-8b (32 x 8 x 128), qwen2.5-7b (28 x 4 x 128), llama3-70b (80 x 8 x 128).
const std::vector<ModelPreset>& ModelPresets();
absl::StatusOr<ModelPreset> FindPreset(const std::string& name);

struct LoadConfig {
  std::string server = "127.0.0.1:50051";
  client::SecurityFlags security;  // --tls-ca, --tls-cert, --tls-key, --tls-server-name, --auth-token
  int32_t concurrency = 4;      // streams (client threads submitting to the in-process engine)
  int32_t pipeline = 2;         // jobs in flight per stream
  int64_t jobs = 0;             // total layer jobs; 0 with duration_s > 0: run for a time
  double duration_s = 0.0;
  double rate = 0.0;            // jobs per second over all streams; 0 = as fast as possible
  ModelPreset preset;           // resolved from --preset
  int32_t context = 4096;       // tokens per head
  DType dtype = DType::kFloat16;
  uint64_t seed = 1;
  int32_t distinct_layers = 4;  // distinct layers of data generated (reused round-robin)
  CompressOptions options;      // the SPEC parameters
  std::optional<DType> output_dtype;  // default: the input dtype
  BackendKind backend = BackendKind::kAuto;
  int32_t slab_kib = 256;
  // Clustering threads of the in-process engine's executor; 0 = the server's (GetInfo's
  // worker_threads), or one per hardware thread when there is no server to ask.
  int32_t threads = 0;
  double connect_timeout_s = 10.0;
  bool compare = false;
  int32_t rounds = 1;           // --compare: rounds of the three runs; medians reported
  // Jobs by reference to shared memory (a unix socket server): the dataset is copied once
  // into a registered region, each stream has `pipeline` result slots there, and only
  // StartJob and the JobResult header cross the socket. With --compare: two more legs,
  // service:cpu+shm next to the slab path and service:identity+shm next to the floor.
  bool shm = false;
  // Decode-time jobs: the jobs a decode-time splice sends (one layer, --context
  // new tokens per head, 256 unless given), in two shapes per round: `concurrency` x
  // `pipeline` in flight (throughput) and one job at a time (latency), each through the
  // in-process engine, the service over slabs and, with `shm`, over shared memory; one JSON
  // line (DecodeJson) with jobs/s, tokens/s and p50/p99 per leg and the ratios to the engine.
  bool decode = false;
  std::string format = "text";  // text | json | csv
  bool progress = false;        // force the progress bar even when stderr is no tty
  bool quiet = false;           // no progress bar at all

  int64_t TokensPerJob() const { return int64_t{preset.kv_heads} * context; }
  int64_t BytesPerJob() const;  // keys + values in
};

// Registers every flag on `app`, writing into `flags`; call FinishConfig() after parsing.
struct LoadFlags {
  LoadConfig config;
  std::string preset = "llama3-8b";
  std::optional<int32_t> context;  // --context; unset: 4096, or 256 with --decode
  std::string dtype = "float16";
  std::string output_dtype = "input";
  std::optional<float> output_scale;  // --output-scale: static fp8 result scale
  std::string backend = "auto";
};
void AddLoadFlags(CLI::App* app, LoadFlags* flags);
// Resolves names and checks combinations; errors say which flag is wrong and why.
absl::StatusOr<LoadConfig> FinishConfig(LoadFlags& flags);
// Parses a whole command line (args without the program name) into a config.
absl::StatusOr<LoadConfig> ParseLoadArgs(const std::vector<std::string>& args);

// The q-quantile (q in [0, 1]) of `values` by linear interpolation between closest ranks
// (numpy's default); 0 for an empty input. `values` need not be sorted.
double Percentile(std::vector<double> values, double q);

// The data the jobs send: `distinct_layers` layers of synthetic clustered KV in the dtype
// (fp8: codes with per-head scales, each head's largest magnitude mapped to the format's).
struct Dataset {
  std::vector<std::vector<uint8_t>> keys;    // per layer, [H, n, d] of dtype
  std::vector<std::vector<uint8_t>> values;  // per layer
  std::vector<std::vector<float>> key_scales, value_scales;  // per layer, [H]; fp8 only
  LayerView View(const LoadConfig& config, size_t layer) const;
};
Dataset MakeDataset(const LoadConfig& config);

struct JobRecord {
  double latency_s = 0.0;
  std::string code;              // "OK" or the status code's name
  int64_t entries_in = 0;
  int64_t entries_out = 0;
  int64_t bytes_in = 0;
  double queue_s = 0.0;          // server: complete input to engine start (in-process too)
  double compute_s = 0.0;        // server: inside the engine (in-process too)
};

struct RunStats {
  std::string label;             // "service:cpu", "service:identity", "in-process:cpu"
  double wall_s = 0.0;
  std::vector<JobRecord> records;
  std::string fatal;             // a stream-level failure, if any
  int32_t threads = 0;           // clustering threads (the server's, or the in-process executor's)
  int32_t concurrency = 0;       // the run's streams and jobs in flight per stream
  int32_t pipeline = 0;

  int64_t jobs_ok() const;
  int64_t jobs_failed() const;
  std::map<std::string, int64_t> errors() const;  // code name -> count
  double tokens_per_s() const;    // layer-head tokens (H x n per job) of OK jobs per second
  double jobs_per_s() const;      // OK jobs per second
  double gb_per_s() const;        // KV bytes in of OK jobs, 1e9 per second
  double compression() const;     // entries out / entries in over OK jobs
  double latency_ms(double q) const;
  // Means over OK jobs, in ms: end-to-end latency, the queue wait and the engine time.
  double mean_latency_ms() const;
  double mean_queue_ms() const;
  double mean_compute_ms() const;
};

// Called now and then with (jobs done, jobs total or -1, seconds elapsed).
using ProgressFn = std::function<void(int64_t, int64_t, double)>;

// Runs the configured load against config.server with `backend`; with `shm`, by reference
// to shared memory (see LoadConfig::shm), labelled "service:<backend>+shm".
RunStats RunService(const LoadConfig& config, const Dataset& data, BackendKind backend,
                    const ProgressFn& progress = nullptr, bool shm = false);
// Asks the server how many clustering threads it runs (0 when it cannot say).
int32_t ServerThreads(const LoadConfig& config);
// The same jobs through an in-process engine: config.concurrency client threads, each with
// config.pipeline jobs in flight, submit to an executor of `threads` clustering threads (the
// server's WorkExecutor, so the engine runs as it does inside the server).
RunStats RunInProcess(const LoadConfig& config, const Dataset& data, BackendKind backend,
                      int32_t threads, const ProgressFn& progress = nullptr);

void PrintStats(const LoadConfig& config, const std::vector<RunStats>& runs, std::ostream& out);
// The --compare line: service, floor, in-process tokens/s and the ratio to the serial bound,
// with the run's shape (preset, context, concurrency, threads).
// Each leg's tokens/s is its median over the rounds (one RunStats per round and leg).
// With `shm` runs (--shm), also the shared memory leg's median and its ratios to the
// in-process engine and to the slab path; with `shm_floor` runs, the floor over shared
// memory and its ratio to the floor over slabs.
std::string CompareJson(const LoadConfig& config, const std::vector<RunStats>& service,
                        const std::vector<RunStats>& floor,
                        const std::vector<RunStats>& in_process,
                        const std::vector<RunStats>& shm = {},
                        const std::vector<RunStats>& shm_floor = {});

// --decode's legs, per load shape: each a run per round.
struct DecodeLegs {
  int32_t concurrency = 0, pipeline = 0;
  std::vector<RunStats> in_process, slabs, shm;
};
// The --decode line: {"decode": {shape, "throughput": {...}, "latency": {...}}}, each leg's
// jobs/s, tokens/s, p50 and p99 the medians over the rounds; throughput ratios of tokens/s
// to the in-process engine's, latency ratios of each leg's p99 to the engine's p99 and p50.
std::string DecodeJson(const LoadConfig& config, const DecodeLegs& throughput,
                       const DecodeLegs& latency);

// The whole command: parses, runs, prints; returns the exit code.
int BenchMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace centroidkv::bench
