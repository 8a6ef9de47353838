// centroidkv-gpu-bench: the CUDA backend against the card's own ceilings, measured in the
// same run (SPEC.md section 5 scaled up): 32k tokens x 256 layer-heads (8 layer jobs
// of 32 heads), head dim 128, fp16, chunk 64 / 256 / 1024, one pass at rho = 0.5. Every row
// writes fp16 result rows (--result-dtype; what the service asks of both backends for fp16
// input).
//
// Measures, and writes as JSON rows (--out, default docs/results/gpu/bench.json):
// - copy: device-to-device cudaMemcpy of 4 GiB; GB/s counts bytes read plus bytes written
//   (2 x size / time), the convention of KINDS.md's 4.3 TB/s reading.
// - h2d: pinned host-to-device cudaMemcpy of 2 GiB; GB/s = size / time.
// - kind "kernel": the batch's stages on the device (inputs already uploaded), timed with CUDA
//   events; kv_gbps = input key + value bytes / time; fraction = kv_gbps / copy GB/s. One row
//   per match kernel (--match: "tiles", the tensor cores, and "warp", CUDA cores). Each row
//   also has the memory floor of the same run: reading the input once and writing the result
//   once (rows in the result dtype, counts, assignment) at the copy's rate, floor_seconds,
//   and fraction_of_floor = floor_seconds / seconds. With rho = 0.5 a float32 result is as
//   large as the fp16 input, so `fraction` could not pass 0.5; fp16 rows allow about 0.67
//   (see docs/gpu/README.md).
// - kind "stages": for each kernel row, seconds per stage (summed over passes) of one more
//   run with CUDA events around every launch: where the kernel time goes.
// - kind "e2e": CudaEngine::Compress on the 8 jobs from 8 threads (host in, host out,
//   batching and overlap included); fraction = kv_gbps / pinned h2d GB/s.
// - kind "cpu": the CPU backend on one layer job (a 32-head slice, labelled by layer_heads).
// tokens_per_s counts layer-head tokens (tokens x layer_heads / time). Medians of --reps.
// The last line on stdout is one JSON object with the headline numbers (gpu-check.sh reads it).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/workload.h"
#include "centroidkv/kernels/engine.h"
#include "centroidkv/kernels/cuda/cuda_engine.h"
#include "kernels/cpu/cpu_engine.h"
#include "kernels/cuda/stream_worker.h"

namespace centroidkv::bench {
namespace {

struct Flags {
  int32_t tokens = 32768;
  int32_t layer_heads = 256;
  int32_t heads_per_job = 32;
  int32_t dim = 128;
  int32_t reps = 3;
  std::vector<int32_t> chunks = {64, 256, 1024};
  std::vector<std::string> match = {"tiles", "warp"};
  std::string result_dtype = "fp16";
  int32_t e2e_chunk = 256;
  bool cpu = true;
  std::string out = "docs/results/gpu/bench.json";
};

// Exits (as CLI11 does) on --help or a bad flag.
Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  int32_t chunk = 0;
  CLI::App app{"centroidkv-gpu-bench: the CUDA backend against the card's copy and upload "
               "bandwidth, and the CPU backend on the same data"};
  app.add_option("--tokens", flags.tokens, "Tokens per layer-head")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--layer-heads", flags.layer_heads, "Layer-heads in all")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heads-per-job", flags.heads_per_job, "Heads per layer job")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--reps", flags.reps, "Timed repetitions (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--chunks", chunk, "One chunk size instead of 64, 256 and 1024")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--match", flags.match, "Match kernels of the kernel rows (tiles, warp)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tiles", "warp"}))
      ->capture_default_str();
  app.add_option("--result-dtype", flags.result_dtype,
                 "Result rows of the GPU rows (fp16, the service's default output for fp16 "
                 "input, or fp32)")
      ->check(CLI::IsMember({"fp16", "fp32"}))
      ->capture_default_str();
  app.add_flag("!--no-cpu", flags.cpu, "Skip the CPU backend rows");
  app.add_option("--out", flags.out, "JSON rows")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    std::exit(app.exit(error));
  }
  if (chunk > 0) flags.chunks = {chunk};
  return flags;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define BENCH_CHECK(expr)                                                                  \
  do {                                                                                     \
    const cudaError_t bench_error_ = (expr);                                               \
    if (bench_error_ != cudaSuccess) {                                                     \
      std::cerr << "centroidkv-gpu-bench: " #expr ": " << cudaGetErrorString(bench_error_) \
                << "\n";                                                                   \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (false)

// Seconds of `run` (which queues work on `stream`), by CUDA events; median of reps.
template <typename Run>
double TimeOnStream(cudaStream_t stream, int reps, Run run) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  run();  // warm-up
  BENCH_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    run();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    seconds.push_back(ms / 1e3);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return Median(seconds);
}

double CopyGbps(cudaStream_t stream, int reps) {
  const size_t bytes = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemsetAsync(a, 1, bytes, stream));
  const double s = TimeOnStream(stream, reps + 2, [&] {
    BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  BENCH_CHECK(cudaFree(a));
  BENCH_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / s / 1e9;
}

double H2dGbps(cudaStream_t stream, int reps) {
  const size_t bytes = size_t{2} << 30;
  void *host = nullptr, *device = nullptr;
  BENCH_CHECK(cudaMallocHost(&host, bytes));
  BENCH_CHECK(cudaMalloc(&device, bytes));
  std::memset(host, 1, bytes);
  const double s = TimeOnStream(stream, reps + 2, [&] {
    BENCH_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
  });
  BENCH_CHECK(cudaFreeHost(host));
  BENCH_CHECK(cudaFree(device));
  return static_cast<double>(bytes) / s / 1e9;
}

struct Row {
  std::string kind;
  int32_t chunk;
  int32_t tokens;
  int32_t layer_heads;
  double seconds;
  double kv_bytes;
  std::optional<double> fraction;
  std::string match = "";                    // kernel rows: the match kernel
  std::optional<double> floor_seconds = {};  // kernel rows: the memory floor
};

std::string RowJson(const std::string& card, const Row& row) {
  const double tokens_per_s = static_cast<double>(row.tokens) * row.layer_heads / row.seconds;
  return absl::StrFormat(
      "{\"card\": \"%s\", \"kind\": \"%s\", \"chunk\": %d, \"tokens\": %d, \"layer_heads\": %d, "
      "\"dtype\": \"fp16\", \"seconds_median\": %.6g, \"tokens_per_s\": %.6g, \"kv_gbps\": "
      "%.6g, \"fraction\": %s%s}",
      card, row.kind, row.chunk, row.tokens, row.layer_heads, row.seconds, tokens_per_s,
      row.kv_bytes / row.seconds / 1e9,
      row.fraction.has_value() ? absl::StrFormat("%.4f", *row.fraction) : "null",
      row.floor_seconds.has_value()
          ? absl::StrFormat(", \"match\": \"%s\", \"floor_seconds\": %.6g, "
                            "\"fraction_of_floor\": %.4f",
                            row.match, *row.floor_seconds, *row.floor_seconds / row.seconds)
          : "");
}

CompressOptions SpecOptions(int32_t chunk, DType result_dtype = DType::kFloat32) {
  CompressOptions options{.target_ratio = 0.5, .chunk_size = chunk, .max_passes = 1,
      .compute_assignment = true, .result_dtype = result_dtype};
  return options;
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::cerr << "centroidkv-gpu-bench: no CUDA device\n";
    return 3;
  }
  cudaDeviceProp props{};
  BENCH_CHECK(cudaGetDeviceProperties(&props, 0));
  const std::string card = props.name;
  std::cerr << "card: " << card << "\n";
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = CopyGbps(stream, flags.reps);
  const double h2d_gbps = H2dGbps(stream, flags.reps);
  std::cerr << absl::StrFormat("copy %.1f GB/s (read + write), pinned h2d %.1f GB/s\n",
                               copy_gbps, h2d_gbps);

  // The data: layer jobs of heads_per_job heads, generated in parallel.
  const int32_t jobs_count = std::max(1, flags.layer_heads / flags.heads_per_job);
  const int32_t layer_heads = jobs_count * flags.heads_per_job;
  std::vector<Workload> workloads(jobs_count);
  {
    std::vector<std::thread> threads;
    for (int32_t j = 0; j < jobs_count; ++j) {
      threads.emplace_back([&, j] {
        WorkloadSpec spec;
        spec.heads = flags.heads_per_job;
        spec.tokens = flags.tokens;
        spec.dim = flags.dim;
        spec.seed = 1 + static_cast<uint64_t>(j);
        workloads[j] = MakeWorkload(spec);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  std::vector<LayerView> views;
  double kv_bytes = 0;
  for (const Workload& w : workloads) {
    views.push_back(w.View());
    kv_bytes += static_cast<double>(w.KvBytes());
  }

  const DType result_dtype = flags.result_dtype == "fp16" ? DType::kFloat16 : DType::kFloat32;
  std::vector<Row> rows;
  std::vector<std::string> stage_rows;  // per-stage seconds of each kernel row
  std::optional<double> kernel_fraction_256, e2e_fraction;
  for (const int32_t chunk : flags.chunks) {
    for (const std::string& match : flags.match) {
      const CompressOptions options = SpecOptions(chunk, result_dtype);
      std::vector<LayerPlan> plans;
      for (const LayerView& view : views) {
        absl::StatusOr<LayerPlan> plan = PlanLayer(view, options, EngineLimits{});
        if (!plan.ok()) {
          std::cerr << plan.status() << "\n";
          return 1;
        }
        plans.push_back(*std::move(plan));
      }
      std::vector<CompressResult> results(jobs_count);
      std::vector<cuda::BatchJob> jobs;
      for (int32_t j = 0; j < jobs_count; ++j) jobs.push_back({&plans[j], &views[j], &results[j]});
      cuda::StreamWorker worker;
      absl::Status status =
          worker.Init(0, match == "warp" ? cuda::MatchKernel::kWarp : cuda::MatchKernel::kTiles);
      if (status.ok()) status = worker.Prepare(jobs);
      if (status.ok()) status = worker.Upload();
      if (!status.ok()) {
        std::cerr << "chunk " << chunk << ": " << status << "\n";
        return 1;
      }
      absl::Status compute = absl::OkStatus();
      const double seconds = TimeOnStream(worker.stream(), flags.reps, [&] {
        if (compute.ok()) compute = worker.Compute();
      });
      if (compute.ok()) compute = worker.Finish();
      if (!compute.ok()) {
        std::cerr << "chunk " << chunk << ": " << compute << "\n";
        return 1;
      }
      const double fraction = kv_bytes / seconds / 1e9 / copy_gbps;
      if (chunk == 256 && match == flags.match.front()) kernel_fraction_256 = fraction;
      double result_bytes = 0;
      for (const CompressResult& r : results) {
        result_bytes += static_cast<double>(DTypeSize(r.dtype)) *
                            static_cast<double>(r.key_elements() + r.value_elements()) +
                        4.0 * static_cast<double>(r.counts.size() + r.assignment.size());
      }
      const double floor_seconds = (kv_bytes + result_bytes) / (copy_gbps * 1e9);
      rows.push_back({"kernel", chunk, flags.tokens, layer_heads, seconds, kv_bytes, fraction,
                      match, floor_seconds});
      std::cerr << RowJson(card, rows.back()) << "\n";
      // Where the time goes: one more run with events around every launch.
      absl::StatusOr<std::vector<std::pair<std::string, double>>> stages = worker.ProfileCompute();
      if (!stages.ok()) {
        std::cerr << "chunk " << chunk << " profile: " << stages.status() << "\n";
        return 1;
      }
      std::string times;
      for (const auto& [stage, stage_seconds] : *stages) {
        absl::StrAppend(&times, times.empty() ? "" : ", ",
                        absl::StrFormat("\"%s\": %.6g", stage, stage_seconds));
      }
      stage_rows.push_back(absl::StrFormat(
          "{\"card\": \"%s\", \"kind\": \"stages\", \"chunk\": %d, \"match\": \"%s\", "
          "\"seconds\": {%s}}",
          card, chunk, match, times));
      std::cerr << stage_rows.back() << "\n";
    }
  }

  {  // End to end through the engine: host in, host out, jobs from many threads.
    absl::StatusOr<std::unique_ptr<cuda::CudaEngine>> engine = cuda::CudaEngine::Create();
    if (!engine.ok()) {
      std::cerr << engine.status() << "\n";
      return 1;
    }
    const CompressOptions options = SpecOptions(flags.e2e_chunk, result_dtype);
    std::vector<double> seconds;
    for (int r = 0; r < flags.reps + 1; ++r) {
      std::vector<absl::Status> statuses(jobs_count);
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      for (int32_t j = 0; j < jobs_count; ++j) {
        threads.emplace_back([&, j] {
          absl::StatusOr<CompressResult> result = (*engine)->Compress(views[j], options);
          statuses[j] = result.status();
        });
      }
      for (std::thread& t : threads) t.join();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (const absl::Status& st : statuses) {
        if (!st.ok()) {
          std::cerr << "e2e: " << st << "\n";
          return 1;
        }
      }
      if (r > 0) seconds.push_back(s);  // the first run allocates the buffers
    }
    const double s = Median(seconds);
    e2e_fraction = kv_bytes / s / 1e9 / h2d_gbps;
    rows.push_back({"e2e", flags.e2e_chunk, flags.tokens, layer_heads, s, kv_bytes, e2e_fraction});
    std::cerr << RowJson(card, rows.back()) << "\n";
  }

  if (flags.cpu) {  // The CPU backend on one layer job (a slice of the data).
    const cpu::CpuEngine cpu_engine;
    for (const int32_t chunk : flags.chunks) {
      const CompressOptions options = SpecOptions(chunk, result_dtype);
      std::vector<double> seconds;
      for (int r = 0; r < std::min(flags.reps, 2); ++r) {
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<CompressResult> result = cpu_engine.Compress(views[0], options);
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (!result.ok()) {
          std::cerr << "cpu: " << result.status() << "\n";
          return 1;
        }
      }
      rows.push_back({"cpu", chunk, flags.tokens, flags.heads_per_job, Median(seconds),
                      static_cast<double>(workloads[0].KvBytes()), std::nullopt});
      std::cerr << RowJson(card, rows.back()) << "\n";
    }
  }

  std::ofstream out(flags.out);
  out << "[\n";
  std::vector<std::string> lines;
  for (const Row& row : rows) lines.push_back(RowJson(card, row));
  lines.insert(lines.end(), stage_rows.begin(), stage_rows.end());
  for (size_t i = 0; i < lines.size(); ++i) {
    out << "  " << lines[i] << (i + 1 < lines.size() ? ",\n" : "\n");
  }
  out << "]\n";
  if (!out) std::cerr << "centroidkv-gpu-bench: could not write " << flags.out << "\n";
  std::cout << absl::StrFormat(
                   "{\"card\": \"%s\", \"copy_gbps\": %.2f, \"h2d_gbps\": %.2f, "
                   "\"kernel_fraction_of_copy\": %s, \"e2e_fraction_of_h2d\": %s}",
                   card, copy_gbps, h2d_gbps,
                   kernel_fraction_256 ? absl::StrFormat("%.4f", *kernel_fraction_256) : "null",
                   e2e_fraction ? absl::StrFormat("%.4f", *e2e_fraction) : "null")
            << std::endl;
  return 0;
}

}  // namespace
}  // namespace centroidkv::bench

int main(int argc, char** argv) { return centroidkv::bench::Main(argc, argv); }
