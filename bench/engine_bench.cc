// centroidkv-cpu-bench: the kernel-level CPU benchmark of SPEC section 5.
//
// One layer job (H = 8 heads x n = 32768 tokens, head dim 128, fp16 keys and values,
// head-major) through the engine that serves BackendKind::kCpu, one pass at ratio 0.5, for
// chunk sizes 64, 256 and 1024; in the same process this machine's fp32 FMA peak
// (cpu_peak.h) and, when built with FAISS, the FAISS peer doing the same per-chunk A-to-B
// matching. Each job runs through ClusterEngine::CompressInto into one result kept across
// jobs (as a server thread keeps one); with --fresh=1 (the default) also through Compress
// into a fresh result each job, reported as fresh_result_seconds.
// It prints first the CPU's model and vector ISA extensions, and the cpu backend's kernel
// level with the fp32 FMA peak (summary JSON: cpu_model, isa_features, kernel_level, peak).
// Metrics (medians over repetitions of wall-clock time per layer job, T):
//   tokens_per_s      layer-head tokens per second = H * n / T (every head's n input tokens
//                     count once; divide by H for one head's rate)
//   gb_per_s          input KV bytes (keys + values, fp16) / T / 1e9
//   gflops            similarity flops / T / 1e9, where the similarity step evaluates
//                     H * sum over chunks |A| * |B| dot products of 2 * d flops each; T is
//                     the whole pipeline (normalise, match, select, merge, compact)
//   fraction_of_peak  gflops / peak_gflops
//   faiss_ratio       tokens_per_s / FAISS tokens_per_s (FAISS: search only, best threading)
//   cpu_seconds       CPU time of the whole process per layer job (all threads): divided by
//                     threads * T, how busy the threads were
//   memory_floor      (top level) seconds to read the job's input once and write its result
//                     once, nothing else, and the bytes moved; per chunk,
//                     fraction_of_memory_floor = memory floor seconds / T
//
// Own flags (--name=value, after Google Benchmark's --benchmark_* flags):
//   --tokens --heads --dim --chunks=64,256,1024 --ratio --sink --recent --seed
//   --passes=N (max_passes of the jobs, default 1; the similarity flops count the first pass)
//   --engine=cpu|reference --reps --min_time --threads --peak_reps --faiss=0|1 --check=0|1
//   --level=scalar|avx2|avx512|amx  (the cpu engine's kernels forced to a level this CPU has,
//                    and the fp32 peak measured with that level's vectors: every level shipped
//                    can be measured on one machine; default: the level chosen at run time)
//   --fresh=0|1 (also time each job into a fresh result: Compress instead of CompressInto)
//   --result_dtype=float32[,float16,bfloat16,fp8_e4m3,fp8_e5m2]  (CompressOptions::result_dtype
//                    of the timed jobs; several side by side, each with its own memory floor,
//                    which then writes the result rows in that dtype; the first is the
//                    headline; fp8 with per-head dynamic scales unless --result_scale)
//   --result_scale=S (fp8 results in the static scale S, one per layer for keys and values,
//                    as a serving engine's calibrated k_scale / v_scale; default 0: dynamic)
//   --input_dtype=float16|fp8_e4m3|fp8_e5m2  (the workload's rows as the engine gets them:
//                    fp16, or quantised to fp8 with per-head scales; the memory floor reads
//                    those bytes; the FAISS peer always works on the fp16 rows)
//   --profile_seconds=S  (after the timed runs, each chunk's headline job again for S
//                    seconds under `perf record`, its samples grouped by pipeline stage:
//                    bench/stage_profile.h; a table, and "profile" in the summary JSON)
//   --profile_dir=DIR (where the perf data go; default /tmp)
//   --dump_dir=DIR  (keys.npy, values.npy, meta.json, assignment_C<chunk>.npy for the
//                    PyTorch peer)  --summary_out=FILE (the JSON summary)
//
// Main runs the steps in order: ParseFlags, SetUp (engine, peak, workload), CheckChunks,
// the registrations (RegisterPipelines, RegisterMemoryFloors, RegisterFaissPeers), the
// benchmarks, MeasurePeaksAfter, and Report (the table and the JSON summary).
#include <benchmark/benchmark.h>
#include <emmintrin.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_peak.h"
#include "bench/stage_profile.h"
#include "bench/workload.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/kernels/engine_factory.h"
#include "kernels/cpu/cpu_engine.h"
#include "kernels/cpu/simd_dispatch.h"

#ifdef CKV_HAVE_FAISS
#include "bench/faiss_peer.h"
#endif

namespace centroidkv::bench {
namespace {

struct Flags {
  WorkloadSpec workload;
  std::vector<int32_t> chunks = {64, 256, 1024};
  double ratio = 0.5;
  int32_t sink = 0;
  int32_t recent = 0;
  int32_t passes = 1;  // max_passes of the jobs
  std::string engine = "cpu";
  std::string level;  // "": the cpu engine's own choice
  int32_t reps = 5;
  double min_time = 0.5;
  int32_t threads = 0;
  int32_t peak_reps = 5;
  bool faiss = true;
  bool check = true;
  bool fresh = true;
  std::vector<DType> result_dtypes = {DType::kFloat32};
  DType input_dtype = DType::kFloat16;  // or fp8 (the fp16 rows quantised per head)
  float result_scale = 0.0f;            // fp8 results: static scale, or 0 for dynamic
  std::string dump_dir;
  std::string summary_out;
  double profile_seconds = 0.0;  // 0: no per-stage profile
  std::string profile_dir = "/tmp";
};

[[noreturn]] void Die(const std::string& message) {
  std::cerr << "centroidkv-cpu-bench: " << message << "\n";
  std::exit(2);
}

template <typename T>
T ParseNumber(const std::string& name, const std::string& text) {
  T value{};
  bool ok = false;
  if constexpr (std::is_same_v<T, double>) {
    ok = absl::SimpleAtod(text, &value);
  } else {
    ok = absl::SimpleAtoi(text, &value);
  }
  if (!ok) Die("--" + name + ": not a number: " + text);
  return value;
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) Die("unknown argument " + arg);
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    if (name == "tokens") {
      flags.workload.tokens = ParseNumber<int32_t>(name, value);
    } else if (name == "heads") {
      flags.workload.heads = ParseNumber<int32_t>(name, value);
    } else if (name == "dim") {
      flags.workload.dim = ParseNumber<int32_t>(name, value);
    } else if (name == "seed") {
      flags.workload.seed = ParseNumber<uint64_t>(name, value);
    } else if (name == "chunks") {
      flags.chunks.clear();
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        flags.chunks.push_back(ParseNumber<int32_t>(name, std::string(part)));
      }
    } else if (name == "ratio") {
      flags.ratio = ParseNumber<double>(name, value);
    } else if (name == "sink") {
      flags.sink = ParseNumber<int32_t>(name, value);
    } else if (name == "recent") {
      flags.recent = ParseNumber<int32_t>(name, value);
    } else if (name == "passes") {
      flags.passes = ParseNumber<int32_t>(name, value);
    } else if (name == "engine") {
      flags.engine = value;
    } else if (name == "level") {
      flags.level = value;
    } else if (name == "reps") {
      flags.reps = ParseNumber<int32_t>(name, value);
    } else if (name == "min_time") {
      flags.min_time = ParseNumber<double>(name, value);
    } else if (name == "threads") {
      flags.threads = ParseNumber<int32_t>(name, value);
    } else if (name == "peak_reps") {
      flags.peak_reps = ParseNumber<int32_t>(name, value);
    } else if (name == "faiss") {
      flags.faiss = ParseNumber<int32_t>(name, value) != 0;
    } else if (name == "fresh") {
      flags.fresh = ParseNumber<int32_t>(name, value) != 0;
    } else if (name == "result_dtype") {
      flags.result_dtypes.clear();
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        const std::optional<DType> dtype =
            ParseKind<DType>(kDTypeNames, std::string_view(part.data(), part.size()));
        if (!dtype.has_value()) {
          Die("--result_dtype: float32, float16, bfloat16, fp8_e4m3 or fp8_e5m2: " + value);
        }
        flags.result_dtypes.push_back(*dtype);
      }
    } else if (name == "input_dtype") {
      const std::optional<DType> dtype = ParseKind<DType>(kDTypeNames, value);
      if (!dtype.has_value() || !(*dtype == DType::kFloat16 || IsFp8(*dtype))) {
        Die("--input_dtype: float16, fp8_e4m3 or fp8_e5m2: " + value);
      }
      flags.input_dtype = *dtype;
    } else if (name == "result_scale") {
      flags.result_scale = static_cast<float>(ParseNumber<double>(name, value));
      if (!(flags.result_scale >= 0.0f) || !std::isfinite(flags.result_scale)) {
        Die("--result_scale: a finite scale > 0, or 0 for dynamic scales: " + value);
      }
    } else if (name == "check") {
      flags.check = ParseNumber<int32_t>(name, value) != 0;
    } else if (name == "profile_seconds") {
      flags.profile_seconds = ParseNumber<double>(name, value);
    } else if (name == "profile_dir") {
      flags.profile_dir = value;
    } else if (name == "dump_dir") {
      flags.dump_dir = value;
    } else if (name == "summary_out") {
      flags.summary_out = value;
    } else {
      Die("unknown flag --" + name);
    }
  }
  if (flags.workload.heads < 1 || flags.workload.tokens < 2 || flags.workload.dim < 1 ||
      flags.chunks.empty() || flags.reps < 1 || flags.result_dtypes.empty() || flags.passes < 1) {
    Die("need --heads >= 1, --tokens >= 2, --dim >= 1, --reps >= 1, --passes >= 1 and some "
        "--chunks");
  }
  if (flags.threads <= 0) {
    flags.threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return flags;
}

CompressOptions OptionsFor(const Flags& flags, int32_t chunk,
                           DType result_dtype = DType::kFloat32) {
  CompressOptions options{.target_ratio = flags.ratio, .chunk_size = chunk,
      .sink_tokens = flags.sink, .recent_tokens = flags.recent, .max_passes = flags.passes,
      .uniform_heads = true, .compute_assignment = true, .result_dtype = result_dtype};
  if (IsFp8(result_dtype) && flags.result_scale > 0.0f) {
    options.result_key_scales = {flags.result_scale};
    options.result_value_scales = {flags.result_scale};
  }
  return options;
}

// Per chunk size: what the untimed check run established.
struct ChunkCheck {
  std::vector<int32_t> assignment;  // [H, n] from the engine
  int64_t output_entries_per_head = 0;
  double faiss_agreement = -1.0;    // fraction of sources FAISS sends where we merged them
};

// Runs the engine once, untimed, and checks what SPEC section 2 guarantees.
ChunkCheck CheckEngine(const ClusterEngine& engine, const Workload& workload,
                       const Flags& flags, int32_t chunk) {
  const WorkloadSpec& spec = workload.spec;
  absl::StatusOr<CompressResult> result =
      engine.Compress(workload.View(), OptionsFor(flags, chunk));
  if (!result.ok()) Die("engine " + std::string(engine.name()) + ": " + result.status().ToString());
  ChunkCheck check;
  const int64_t target = static_cast<int64_t>(std::ceil(flags.ratio * spec.tokens));
  for (int32_t h = 0; h < spec.heads; ++h) {
    const int64_t begin = result->offsets[h];
    const int64_t end = result->offsets[h + 1];
    uint64_t total = 0;
    for (int64_t i = begin; i < end; ++i) total += result->counts[i];
    if (total != static_cast<uint64_t>(spec.tokens)) {
      Die("chunk " + std::to_string(chunk) + ": counts of head " + std::to_string(h) +
          " sum to " + std::to_string(total));
    }
    if (h == 0) check.output_entries_per_head = end - begin;
    if (end - begin != check.output_entries_per_head) Die("heads differ in length");
  }
  if (check.output_entries_per_head < target) Die("compressed below the target length");
  check.assignment = std::move(result->assignment);
  if (static_cast<int64_t>(check.assignment.size()) != int64_t{spec.heads} * spec.tokens) {
    Die("no assignment in the result");
  }
  return check;
}

struct Samples {
  std::vector<double> seconds;      // per-iteration wall time of each repetition
  std::vector<double> cpu_seconds;  // per-iteration CPU time (process-wide where measured so)
  double aggregate_median = 0.0;
};

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The console reporter, plus a copy of every repetition's time per iteration.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  CapturingReporter()
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    for (const Run& run : reports) {
      if (run.error_occurred || run.iterations <= 0) continue;
      const double per_iteration = run.real_accumulated_time / static_cast<double>(run.iterations);
      Samples& samples = samples_[run.run_name.function_name];
      if (run.run_type == Run::RT_Iteration) {
        samples.seconds.push_back(per_iteration);
        samples.cpu_seconds.push_back(run.cpu_accumulated_time /
                                      static_cast<double>(run.iterations));
      } else if (run.aggregate_name == "median") {
        samples.aggregate_median = per_iteration;
      }
    }
    ConsoleReporter::ReportRuns(reports);
  }

  // Median seconds per layer job of benchmark `name`, or 0 when it did not run.
  double MedianSeconds(const std::string& name) const {
    auto it = samples_.find(name);
    if (it == samples_.end()) return 0.0;
    return it->second.seconds.empty() ? it->second.aggregate_median : Median(it->second.seconds);
  }
  // Median CPU seconds per layer job (all threads of the process), or 0.
  double MedianCpuSeconds(const std::string& name) const {
    auto it = samples_.find(name);
    return it == samples_.end() ? 0.0 : Median(it->second.cpu_seconds);
  }
  size_t Repetitions(const std::string& name) const {
    auto it = samples_.find(name);
    return it == samples_.end() ? 0 : it->second.seconds.size();
  }

 private:
  std::map<std::string, Samples> samples_;
};

// Benchmark names; a result dtype other than float32 is part of the name.
std::string DTypeSuffix(DType dtype) {
  return dtype == DType::kFloat32 ? "" : "_" + std::string(DTypeName(dtype));
}
std::string PipelineName(int32_t chunk, DType dtype = DType::kFloat32) {
  return "pipeline" + DTypeSuffix(dtype) + "/C" + std::to_string(chunk);
}
std::string FreshName(int32_t chunk, DType dtype = DType::kFloat32) {
  return "pipeline_fresh" + DTypeSuffix(dtype) + "/C" + std::to_string(chunk);
}
std::string MemoryFloorName(DType dtype) { return "memory_floor" + DTypeSuffix(dtype); }
std::string FaissName(std::string_view threading, int32_t chunk) {
  return "faiss_" + std::string(threading) + "/C" + std::to_string(chunk);
}

// Counters shown next to each benchmark (the summary recomputes them from the medians).
void SetCounters(benchmark::State& state, double tokens, double kv_bytes, double flops,
                 double peak_gflops) {
  using benchmark::Counter;
  state.counters["tok/s"] = Counter(tokens, Counter::kIsIterationInvariantRate);
  if (kv_bytes > 0) {
    state.counters["GB/s"] = Counter(kv_bytes / 1e9, Counter::kIsIterationInvariantRate);
  }
  state.counters["GFLOP/s"] = Counter(flops / 1e9, Counter::kIsIterationInvariantRate);
  state.counters["of_peak"] =
      Counter(flops / 1e9 / peak_gflops, Counter::kIsIterationInvariantRate);
}

// Registers benchmark `name`: every iteration runs `job` once (an error ends the run and is
// reported); wall-clock time per job in milliseconds, process CPU time alongside, over
// --reps repetitions of at least --min_time. `counters` (may be empty) sets the columns.
void RegisterJob(const std::string& name, const Flags& flags, std::function<absl::Status()> job,
                 std::function<void(benchmark::State&)> counters) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [job = std::move(job), counters = std::move(counters)](
                                   benchmark::State& state) {
                                 for (auto _ : state) {
                                   if (absl::Status status = job(); !status.ok()) {
                                     state.SkipWithError(status.ToString().c_str());
                                     break;
                                   }
                                 }
                                 if (counters) counters(state);
                               })
      ->MeasureProcessCPUTime()
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(flags.min_time)
      ->Repetitions(flags.reps);
}

void WriteMeta(const Flags& flags, const std::string& engine_name) {
  std::ofstream meta(flags.dump_dir + "/meta.json");
  meta << "{\"heads\": " << flags.workload.heads << ", \"tokens\": " << flags.workload.tokens
       << ", \"dim\": " << flags.workload.dim << ", \"seed\": " << flags.workload.seed
       << ", \"ratio\": " << flags.ratio << ", \"sink\": " << flags.sink
       << ", \"recent\": " << flags.recent << ", \"engine\": \"" << engine_name
       << "\", \"chunks\": [";
  for (size_t i = 0; i < flags.chunks.size(); ++i) meta << (i ? ", " : "") << flags.chunks[i];
  meta << "]}\n";
  if (!meta) Die("cannot write " + flags.dump_dir + "/meta.json");
}

// The CPU's model name (/proc/cpuinfo), for the report.
std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return "unknown";
}

// The vector ISA extensions that choose the cpu backend's level, as "avx2 fma f16c -avx512f"
// (a leading '-': absent).
std::string IsaFeatures() {
  __builtin_cpu_init();
  const std::pair<const char*, bool> features[] = {
      {"avx2", __builtin_cpu_supports("avx2") != 0},
      {"fma", __builtin_cpu_supports("fma") != 0},
      {"f16c", __builtin_cpu_supports("f16c") != 0},
      {"avx512f", __builtin_cpu_supports("avx512f") != 0},
      {"avx512bf16", __builtin_cpu_supports("avx512bf16") != 0},
      {"avx512vnni", __builtin_cpu_supports("avx512vnni") != 0},
      {"amx-tile", __builtin_cpu_supports("amx-tile") != 0},
  };
  std::string out;
  for (const auto& [name, present] : features) {
    if (!out.empty()) out += ' ';
    out += (present ? "" : "-") + std::string(name);
  }
  return out;
}

// What the steps of one run share: the engine, this machine's numbers, the data, and what
// the untimed checks and the registration established.
struct BenchRun {
  std::unique_ptr<EngineSet> engines;
  std::unique_ptr<cpu::CpuEngine> forced_level;  // --level: a cpu engine of that level
  const ClusterEngine* engine = nullptr;
  std::string engine_name;
  std::string kernel_level;  // the cpu backend's kernels on this CPU: scalar, avx2, avx512, amx
  int32_t int16_min_chunk = 0;  // chunks matched in 16-bit integers from this length; 0: none
  PeakOptions peak_options;
  PeakResult peak_before;
  std::string cpu_model;
  std::string isa_features;
  Workload workload;
  LayerView view;
  double tokens = 0.0;    // layer-head tokens per job
  double kv_bytes = 0.0;  // input bytes per job
  std::map<int32_t, ChunkCheck> checks;
  std::map<int32_t, double> flops_per_job;
  // Per result dtype, the first chunk's result (it sizes the memory floor's result).
  std::map<DType, std::shared_ptr<CompressResult>> first_results;
  std::map<DType, double> memory_floor_bytes;
};

// What the timed runs measured besides the benchmarks' own times.
struct AfterRuns {
  PeakResult peak_after;
  double peak_gflops = 0.0;  // the best of the peaks before and after
  std::optional<PeakResult> amx_peak;
  std::optional<PeakResult> int16_peak;  // where the kernel level matches in 16-bit integers
};

// The engine, this machine's peak and ISA, and the workload (dumped with --dump_dir).
void SetUp(const Flags& flags, BenchRun* run) {
  const WorkloadSpec& spec = flags.workload;
  run->engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> selected =
      flags.engine == "reference" ? run->engines->Select(BackendKind::kReference)
      : flags.engine == "cpu"     ? run->engines->Select(BackendKind::kCpu)
                                  : absl::InvalidArgumentError("--engine: cpu or reference");
  if (!selected.ok()) Die(selected.status().ToString());
  run->engine = *selected;
  run->engine_name = std::string(run->engine->name());
  // The cpu backend's kernels on this CPU (simd_dispatch.h): scalar, avx2, avx512 or amx.
  run->kernel_level = std::string(cpu::SimdLevelName(cpu::DetectSimdLevel()));
  cpu::SimdLevel kernels_level = cpu::DetectSimdLevel();
  if (!flags.level.empty()) {
    std::optional<cpu::SimdLevel> level;
    for (cpu::SimdLevel supported : cpu::SupportedSimdLevels()) {
      if (cpu::SimdLevelName(supported) == flags.level) level = supported;
    }
    if (!level.has_value() || flags.engine != "cpu") {
      Die("--level=" + flags.level + ": needs --engine=cpu and a level this CPU has");
    }
    run->forced_level =
        std::make_unique<cpu::CpuEngine>(EngineLimits{}, cpu::CpuEngineOptions{level});
    run->engine = run->forced_level.get();
    run->kernel_level = flags.level;
    kernels_level = *level;
    // The peak of the vectors that level's match kernel multiplies with (amx: its fp32
    // work is AVX-512; its bf16 peak is printed as context).
    run->peak_options.isa = *level == cpu::SimdLevel::kAmx ? "avx512" : flags.level;
  }

  if (flags.engine == "cpu" && cpu::KernelsFor(kernels_level).match_int16 != nullptr) {
    run->int16_min_chunk = cpu::KernelsFor(kernels_level).int16_min_chunk;
  }

  run->peak_options.threads = flags.threads;
  run->peak_options.repetitions = flags.peak_reps;
  run->peak_before = MeasureFp32Peak(run->peak_options);
  const PeakResult& peak_before = run->peak_before;
  run->cpu_model = CpuModel();
  run->isa_features = IsaFeatures();
  std::cout << "CPU: " << run->cpu_model << " (" << run->isa_features << ")\n"
            << "kernel level: " << run->kernel_level
            << (run->int16_min_chunk > 0
                    ? " (chunks of " + std::to_string(run->int16_min_chunk) +
                          " rows and more matched in 16-bit integers)"
                    : std::string())
            << "; fp32 FMA peak (" << peak_before.isa
            << ", " << peak_before.threads << " threads, best of " << peak_before.samples.size()
            << "): " << peak_before.gflops << " GFLOP/s\n";

  std::cout << "generating " << spec.heads << " heads x " << spec.tokens << " tokens x d "
            << spec.dim << " (fp16, seed " << spec.seed << ")\n"
            << std::flush;
  run->workload = MakeWorkload(spec);
  if (IsFp8(flags.input_dtype)) {
    AddFp8Rows(flags.input_dtype, &run->workload);
    std::cout << "input as " << DTypeName(flags.input_dtype) << " codes, per-head scales\n";
  }
  run->view = run->workload.View();
  run->tokens = static_cast<double>(spec.heads) * spec.tokens;
  run->kv_bytes = static_cast<double>(run->workload.KvBytes());
  if (!flags.dump_dir.empty()) {
    if (absl::Status status = WriteWorkloadNpy(run->workload, flags.dump_dir); !status.ok()) {
      Die(status.ToString());
    }
    WriteMeta(flags, run->engine_name);
  }
}

// Per chunk size: the similarity flops of a job, and (with --check or --dump_dir) one
// untimed run of the engine, checked (CheckEngine), its assignment dumped with --dump_dir.
void CheckChunks(const Flags& flags, BenchRun* run) {
  const WorkloadSpec& spec = flags.workload;
  for (int32_t chunk : flags.chunks) {
    const std::vector<ChunkSpan> spans = FirstPassChunks(spec.tokens, chunk, flags.sink,
                                                          flags.recent);
    run->flops_per_job[chunk] =
        static_cast<double>(spec.heads) * SimilarityPairs(spans) * 2.0 * spec.dim;
    if (flags.check || !flags.dump_dir.empty()) {
      std::cout << "checking " << run->engine_name << " at chunk " << chunk << "\n" << std::flush;
      run->checks[chunk] = CheckEngine(*run->engine, run->workload, flags, chunk);
      if (!flags.dump_dir.empty()) {
        const std::string path =
            flags.dump_dir + "/assignment_C" + std::to_string(chunk) + ".npy";
        absl::Status status = WriteNpy(path, NpyType::kInt32, {spec.heads, spec.tokens},
                                       run->checks[chunk].assignment.data());
        if (!status.ok()) Die(status.ToString());
      }
    }
  }
}

// The engine's benchmarks, per chunk size and result dtype: pipeline (CompressInto into one
// kept result) and, with --fresh, pipeline_fresh (Compress into a fresh result).
void RegisterPipelines(const Flags& flags, BenchRun* run) {
  const ClusterEngine* engine = run->engine;
  const LayerView view = run->view;
  const double tokens = run->tokens;
  const double kv_bytes = run->kv_bytes;
  // Ours first, then the peers: OpenMP threads that spin after FAISS cannot slow us down.
  // Per result dtype, the first chunk's result sizes the memory floor's result.
  for (int32_t chunk : flags.chunks) {
    for (DType dtype : flags.result_dtypes) {
      const CompressOptions options = OptionsFor(flags, chunk, dtype);
      const double flops = run->flops_per_job[chunk];
      const double peak = run->peak_before.gflops;
      // The headline: one result kept across jobs (CompressInto), as a server thread keeps
      // one per worker; its memory is faulted in once, before timing.
      auto reused = std::make_shared<CompressResult>();
      if (absl::Status status = engine->CompressInto(view, options, reused.get()); !status.ok()) {
        Die(status.ToString());
      }
      run->first_results.emplace(dtype, reused);
      auto counters = [tokens, kv_bytes, flops, peak](benchmark::State& state) {
        SetCounters(state, tokens, kv_bytes, flops, peak);
      };
      RegisterJob(
          PipelineName(chunk, dtype), flags,
          [engine, view, options, reused] {
            absl::Status status = engine->CompressInto(view, options, reused.get());
            benchmark::DoNotOptimize(reused->counts.data());
            return status;
          },
          counters);
      // The same job into a fresh result every time (Compress): adds the page faults and
      // zero-fill of the result's memory.
      if (flags.fresh) {
        RegisterJob(
            FreshName(chunk, dtype), flags,
            [engine, view, options] {
              absl::StatusOr<CompressResult> result = engine->Compress(view, options);
              if (result.ok()) benchmark::DoNotOptimize(result->counts.data());
              return result.status();
            },
            counters);
      }
    }
  }
}

// The memory floor of one job: read every input key and value once and write a result's
// worth of keys and values (in the result dtype), counts and assignment once (non-temporal
// stores, as the engine writes), over all threads with oneTBB like the engine, and nothing
// else. No implementation that reads its input and writes this result can be faster on
// this machine; at small chunks the pipeline is measured against it too.
void RegisterMemoryFloors(const Flags& flags, BenchRun* run) {
  const LayerView view = run->view;
  const double kv_bytes = run->kv_bytes;
  for (DType dtype : flags.result_dtypes) {
    const CompressResult& sizes = *run->first_results.at(dtype);
    const int64_t out_bytes =
        static_cast<int64_t>(sizes.key_elements() + sizes.value_elements()) *
            DTypeSize(sizes.dtype) +
        static_cast<int64_t>(sizes.counts.size()) * static_cast<int64_t>(sizeof(sizes.counts[0])) +
        static_cast<int64_t>(sizes.assignment.size()) * 4;
    run->memory_floor_bytes[dtype] = static_cast<double>(out_bytes) + kv_bytes;
    // 16-byte aligned (operator new's alignment), as _mm_stream_si128 needs.
    auto out = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(out_bytes / 8 + 2));
    const int64_t in_bytes = static_cast<int64_t>(kv_bytes) / 2;  // keys, then values
    const int64_t out_vectors = static_cast<int64_t>(out->size()) / 2;
    RegisterJob(
        MemoryFloorName(dtype), flags,
        [view, in_bytes, out, out_vectors] {
          constexpr int64_t kBlocks = 1024;
          auto* out_data = reinterpret_cast<__m128i*>(out->data());
          std::atomic<uint64_t> sink{0};
          tbb::parallel_for(int64_t{0}, kBlocks, [&](int64_t b) {
            uint64_t x = 0;
            for (const void* data : {view.keys, view.values}) {
              const auto* words = static_cast<const uint64_t*>(data);
              const int64_t begin = in_bytes / 8 * b / kBlocks;
              const int64_t end = in_bytes / 8 * (b + 1) / kBlocks;
              for (int64_t i = begin; i < end; ++i) x ^= words[i];
            }
            const __m128i zero = _mm_set1_epi64x(static_cast<int64_t>(x & 1));
            for (int64_t i = out_vectors * b / kBlocks; i < out_vectors * (b + 1) / kBlocks; ++i) {
              _mm_stream_si128(out_data + i, zero);
            }
            sink.fetch_xor(x, std::memory_order_relaxed);
          });
          _mm_sfence();
          benchmark::DoNotOptimize(sink.load());
          return absl::OkStatus();
        },
        nullptr);
  }
}

#ifdef CKV_HAVE_FAISS
// One matcher at a time (its indexes hold the whole B half of the layer): built on first
// use for a chunk size, outside the timed loop.
struct FaissState {
  int32_t chunk = -1;
  std::unique_ptr<FaissMatcher> matcher;
};

// The FAISS peer's benchmarks (with --faiss): per chunk size, both threadings.
std::shared_ptr<FaissState> RegisterFaissPeers(const Flags& flags, BenchRun* run) {
  auto faiss_state = std::make_shared<FaissState>();
  if (flags.faiss) {
    const double tokens = run->tokens;
    for (int32_t chunk : flags.chunks) {
      for (FaissThreading threading : {FaissThreading::kInternal, FaissThreading::kOverChunks}) {
        const double flops = run->flops_per_job[chunk];
        const double peak = run->peak_before.gflops;
        const int32_t threads = flags.threads;
        const Flags* flags_ptr = &flags;
        const Workload* workload_ptr = &run->workload;
        auto* check = flags.check ? &run->checks[chunk] : nullptr;
        benchmark::RegisterBenchmark(
            FaissName(FaissThreadingName(threading), chunk).c_str(),
            [=](benchmark::State& state) {
              if (faiss_state->chunk != chunk) {
                faiss_state->matcher.reset();
                faiss_state->matcher = std::make_unique<FaissMatcher>(
                    *workload_ptr, FirstPassChunks(workload_ptr->spec.tokens, chunk,
                                                   flags_ptr->sink, flags_ptr->recent));
                faiss_state->chunk = chunk;
              }
              FaissMatcher& matcher = *faiss_state->matcher;
              FaissMatcher::ConfigureThreads(threading, threads);
              for (auto _ : state) matcher.Match(threading, threads);
              SetCounters(state, tokens, 0.0, flops, peak);
              if (check != nullptr && threading == FaissThreading::kInternal) {
                // Where FAISS sends a source, our engine merged it (every source merges in
                // one pass at ratio 0.5), up to near-ties in float rounding.
                int64_t agree = 0;
                for (int64_t i = 0; i < matcher.num_sources(); ++i) {
                  const int64_t row = int64_t{matcher.SourceHead(i)} * workload_ptr->spec.tokens;
                  const int64_t b = matcher.DestinationToken(i);
                  agree += b >= 0 && check->assignment[row + matcher.SourceToken(i)] ==
                                         check->assignment[row + b];
                }
                check->faiss_agreement =
                    static_cast<double>(agree) / static_cast<double>(matcher.num_sources());
              }
            })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(flags.min_time)
            ->Repetitions(flags.reps);
      }
    }
  }
  return faiss_state;
}
#endif

// With --profile_seconds: per chunk size, the headline job (CompressInto into one kept
// result, as timed) under perf, grouped by stage (stage_profile.h); a table on stdout.
std::map<int32_t, StageProfile> ProfileChunks(const Flags& flags, const BenchRun& run) {
  std::map<int32_t, StageProfile> profiles;
  if (flags.profile_seconds <= 0.0) return profiles;
  for (int32_t chunk : flags.chunks) {
    const CompressOptions options = OptionsFor(flags, chunk, flags.result_dtypes.front());
    CompressResult reused;
    auto job = [&] { return run.engine->CompressInto(run.view, options, &reused); };
    if (absl::Status status = job(); !status.ok()) Die(status.ToString());  // faulted in
    const std::string data = flags.profile_dir + "/centroidkv-cpu-bench-C" +
                             std::to_string(chunk) + "-" + run.kernel_level + ".perf.data";
    std::cout << "profiling chunk " << chunk << " for " << flags.profile_seconds << " s\n"
              << std::flush;
    absl::StatusOr<StageProfile> profile =
        ProfileStages(job, flags.profile_seconds, /*frequency=*/2999, data);
    if (!profile.ok()) Die("--profile_seconds: " + profile.status().ToString());
    profiles[chunk] = *std::move(profile);
  }
  std::cout << "\nwhere the time goes (share of the process's perf samples, kernel level "
            << run.kernel_level << "):\n" << std::setw(52) << std::left << "stage" << std::right;
  for (const auto& [chunk, profile] : profiles) std::cout << std::setw(9) << ("C=" + std::to_string(chunk));
  std::cout << "\n";
  for (size_t i = 0; i < StageNames().size(); ++i) {
    std::cout << std::setw(52) << std::left << StageNames()[i] << std::right;
    for (const auto& [chunk, profile] : profiles) {
      std::cout << std::setw(8) << std::fixed << std::setprecision(1)
                << 100.0 * profile.stages[i].share << "%";
    }
    std::cout << "\n";
  }
  std::cout << std::setw(52) << std::left << "(samples, jobs)" << std::right;
  for (const auto& [chunk, profile] : profiles) {
    std::cout << "  " << profile.samples << "/" << profile.jobs;
  }
  std::cout << std::defaultfloat << std::setprecision(6) << "\n";
  return profiles;
}

// The fp32 FMA peak again after the timed runs (the best of both is used), and the AMX
// bf16 peak where the CPU has one.
AfterRuns MeasurePeaksAfter(const BenchRun& run) {
  AfterRuns after;
  after.peak_after = MeasureFp32Peak(run.peak_options);
  after.peak_gflops = std::max(run.peak_before.gflops, after.peak_after.gflops);
  std::cout << "fp32 FMA peak after the runs: " << after.peak_after.gflops
            << " GFLOP/s; using the best: " << after.peak_gflops << "\n";
  // Context only (fraction_of_peak stays against the fp32 FMA peak): the matrix engine the
  // cpu backend's "amx" level matches on, where the CPU has one.
  after.amx_peak = MeasureAmxBf16Peak(run.peak_options);
  if (after.amx_peak.has_value()) {
    std::cout << "AMX bf16 peak (context; the amx level spends 3 bf16 products per fp32 one): "
              << after.amx_peak->gflops << " GFLOP/s\n";
  }
  // Context too: the ceiling of the int16 match kernel (the same vectors as the fp32 peak).
  if (run.int16_min_chunk > 0) {
    PeakOptions options = run.peak_options;
    options.isa = run.peak_before.isa;
    after.int16_peak = MeasureInt16Peak(options);
    if (after.int16_peak.has_value()) {
      std::cout << "int16 multiply-add peak (context; " << after.int16_peak->isa
                << ", 2 ops per product): " << after.int16_peak->gflops << " Gop/s\n";
    }
  }
  return after;
}

// The summary, from the medians: a table on stdout, then the JSON line (also written to
// --summary_out); the headline is the first result dtype.
void Report(const Flags& flags, BenchRun& run, const CapturingReporter& reporter,
            const AfterRuns& after, const std::map<int32_t, StageProfile>& profiles) {
  const WorkloadSpec& spec = flags.workload;
  const std::string& engine_name = run.engine_name;
  const std::string& kernel_level = run.kernel_level;
  const std::string& cpu_model = run.cpu_model;
  const std::string& isa_features = run.isa_features;
  const PeakResult& peak_before = run.peak_before;
  const PeakResult& peak_after = after.peak_after;
  const double peak_gflops = after.peak_gflops;
  const std::optional<PeakResult>& amx_peak = after.amx_peak;
  const double tokens = run.tokens;
  const double kv_bytes = run.kv_bytes;
  std::map<int32_t, double>& flops_per_job = run.flops_per_job;
  std::map<DType, double>& memory_floor_bytes = run.memory_floor_bytes;
  const std::map<int32_t, ChunkCheck>& checks = run.checks;

  const DType headline_dtype = flags.result_dtypes.front();
  const double memory_floor_seconds = reporter.MedianSeconds(MemoryFloorName(headline_dtype));
  std::ostringstream json;
  json << std::setprecision(6);
  json << "{\"engine\": \"" << engine_name << "\", \"heads\": " << spec.heads
       << ", \"tokens\": " << spec.tokens << ", \"dim\": " << spec.dim
       << ", \"dtype\": \"" << DTypeName(flags.input_dtype) << "\", \"result_dtype\": \""
       << DTypeName(headline_dtype) << "\", \"result_scale\": " << flags.result_scale
       << ", \"ratio\": " << flags.ratio << ", \"sink\": " << flags.sink
       << ", \"recent\": " << flags.recent << ", \"max_passes\": " << flags.passes
       << ", \"seed\": " << spec.seed
       << ", \"threads\": " << flags.threads << ", \"peak\": {\"isa\": \"" << peak_before.isa
       << "\", \"before_gflops\": " << peak_before.gflops
       << ", \"after_gflops\": " << peak_after.gflops << ", \"gflops\": " << peak_gflops
       << "}, \"kernel_level\": \"" << kernel_level << "\", \"int16_min_chunk\": "
       << (run.int16_min_chunk > 0 ? std::to_string(run.int16_min_chunk) : std::string("null"))
       << ", \"cpu_model\": \"" << cpu_model
       << "\", \"isa_features\": \"" << isa_features << "\", \"amx_bf16_peak_gflops\": "
       << (amx_peak.has_value() ? std::to_string(amx_peak->gflops) : std::string("null"))
       << ", \"int16_peak_gops\": "
       << (after.int16_peak.has_value() ? std::to_string(after.int16_peak->gflops)
                                        : std::string("null"))
       << ", \"memory_floor\": {\"seconds\": " << memory_floor_seconds
       << ", \"bytes\": " << memory_floor_bytes[headline_dtype] << ", \"gb_per_s\": "
       << (memory_floor_seconds > 0.0
               ? memory_floor_bytes[headline_dtype] / memory_floor_seconds / 1e9
               : 0.0)
       << "}, \"faiss_built\": "
#ifdef CKV_HAVE_FAISS
       << "true"
#else
       << "false"
#endif
       << ", \"chunks\": [";
  std::cout << "\nsummary (medians; engine " << engine_name << ", kernel level " << kernel_level
            << ", fp32 FMA peak " << peak_gflops << " GFLOP/s " << peak_before.isa << "; CPU "
            << cpu_model << ")\n"
            << "memory floor: " << memory_floor_seconds * 1e3 << " ms per job ("
            << memory_floor_bytes[headline_dtype] / 1e6 << " MB read and written)\n"
            << "chunk  ms/layer  Mtok/s  GB/s    GFLOP/s  of_peak  faiss_ratio\n";
  bool first = true;
  for (int32_t chunk : flags.chunks) {
    const double seconds = reporter.MedianSeconds(PipelineName(chunk, headline_dtype));
    if (seconds <= 0.0) continue;
    const double tokens_per_s = tokens / seconds;
    const double gflops = flops_per_job[chunk] / seconds / 1e9;
    double faiss_seconds = 0.0;
    std::string faiss_best;
    for (const char* threading : {"internal", "over_chunks"}) {
      const double s = reporter.MedianSeconds(FaissName(threading, chunk));
      if (s > 0.0 && (faiss_seconds == 0.0 || s < faiss_seconds)) {
        faiss_seconds = s;
        faiss_best = threading;
      }
    }
    json << (first ? "" : ", ") << "{\"chunk\": " << chunk << ", \"seconds\": " << seconds
         << ", \"repetitions\": " << reporter.Repetitions(PipelineName(chunk, headline_dtype))
         << ", \"tokens_per_s\": " << tokens_per_s << ", \"gb_per_s\": " << kv_bytes / seconds / 1e9
         << ", \"similarity_flops\": " << flops_per_job[chunk] << ", \"gflops\": " << gflops
         << ", \"peak_gflops\": " << peak_gflops
         << ", \"fraction_of_peak\": " << gflops / peak_gflops;
    json << ", \"cpu_seconds\": "
         << reporter.MedianCpuSeconds(PipelineName(chunk, headline_dtype))
         << ", \"fraction_of_memory_floor\": " << memory_floor_seconds / seconds;
    if (const double fresh = reporter.MedianSeconds(FreshName(chunk, headline_dtype));
        fresh > 0.0) {
      json << ", \"fresh_result_seconds\": " << fresh;
    }
    std::cout << std::setw(5) << chunk << "  " << std::setw(8) << seconds * 1e3 << "  "
              << std::setw(6) << tokens_per_s / 1e6 << "  " << std::setw(6)
              << kv_bytes / seconds / 1e9 << "  " << std::setw(7) << gflops << "  "
              << std::setw(7) << gflops / peak_gflops << "  ";
    if (faiss_seconds > 0.0) {
      json << ", \"faiss_seconds\": " << faiss_seconds << ", \"faiss_threading\": \""
           << faiss_best << "\", \"faiss_internal_seconds\": "
           << reporter.MedianSeconds(FaissName("internal", chunk))
           << ", \"faiss_over_chunks_seconds\": "
           << reporter.MedianSeconds(FaissName("over_chunks", chunk))
           << ", \"faiss_tokens_per_s\": " << tokens / faiss_seconds
           << ", \"faiss_ratio\": " << faiss_seconds / seconds;
      std::cout << faiss_seconds / seconds;
    } else {
      json << ", \"faiss_ratio\": null";
      std::cout << "-";
    }
    auto check = checks.find(chunk);
    if (check != checks.end()) {
      json << ", \"entries_per_head\": " << check->second.output_entries_per_head;
      if (check->second.faiss_agreement >= 0.0) {
        json << ", \"faiss_agreement\": " << check->second.faiss_agreement;
      }
    }
    json << "}";
    std::cout << "\n";
    first = false;
  }
  json << "]";
  // Every result dtype side by side (the same job, rows written in that dtype).
  std::cout << "\nby result dtype (medians): chunk  dtype  ms/layer  memory floor ms  "
               "fraction of memory floor\n";
  json << ", \"by_result_dtype\": [";
  for (size_t i = 0; i < flags.result_dtypes.size(); ++i) {
    const DType dtype = flags.result_dtypes[i];
    const double floor_seconds = reporter.MedianSeconds(MemoryFloorName(dtype));
    json << (i ? ", " : "") << "{\"result_dtype\": \"" << DTypeName(dtype)
         << "\", \"memory_floor\": {\"seconds\": " << floor_seconds
         << ", \"bytes\": " << memory_floor_bytes[dtype] << "}, \"chunks\": [";
    for (size_t c = 0; c < flags.chunks.size(); ++c) {
      const int32_t chunk = flags.chunks[c];
      const double seconds = reporter.MedianSeconds(PipelineName(chunk, dtype));
      json << (c ? ", " : "") << "{\"chunk\": " << chunk << ", \"seconds\": " << seconds
           << ", \"cpu_seconds\": " << reporter.MedianCpuSeconds(PipelineName(chunk, dtype))
           << ", \"fresh_result_seconds\": " << reporter.MedianSeconds(FreshName(chunk, dtype))
           << ", \"fraction_of_memory_floor\": "
           << (seconds > 0.0 ? floor_seconds / seconds : 0.0) << "}";
      std::cout << std::setw(5) << chunk << "  " << std::setw(8) << DTypeName(dtype) << "  "
                << std::setw(8) << seconds * 1e3 << "  " << std::setw(8) << floor_seconds * 1e3
                << "  " << std::setw(6) << (seconds > 0.0 ? floor_seconds / seconds : 0.0)
                << "\n";
    }
    json << "]}";
  }
  json << "]";
  if (!profiles.empty()) {
    json << ", \"profile\": [";
    bool first_profile = true;
    for (const auto& [chunk, profile] : profiles) {
      json << (first_profile ? "" : ", ") << "{\"chunk\": " << chunk
           << ", \"samples\": " << profile.samples << ", \"jobs\": " << profile.jobs
           << ", \"perf_data\": \"" << profile.perf_data << "\", \"stages\": {";
      for (size_t i = 0; i < profile.stages.size(); ++i) {
        json << (i ? ", " : "") << "\"" << profile.stages[i].stage
             << "\": " << profile.stages[i].share;
      }
      json << "}}";
      first_profile = false;
    }
    json << "]";
  }
  json << "}";
  if (!flags.summary_out.empty()) {
    std::ofstream out(flags.summary_out);
    out << json.str() << "\n";
    if (!out) Die("cannot write " + flags.summary_out);
  }
  std::cout << json.str() << "\n";
}

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // removes the --benchmark_* flags it knows
  const Flags flags = ParseFlags(argc, argv);
  BenchRun run;
  SetUp(flags, &run);
  CheckChunks(flags, &run);
  RegisterPipelines(flags, &run);
  RegisterMemoryFloors(flags, &run);
#ifdef CKV_HAVE_FAISS
  std::shared_ptr<FaissState> faiss_state = RegisterFaissPeers(flags, &run);
#endif

  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
#ifdef CKV_HAVE_FAISS
  faiss_state->matcher.reset();
#endif
  const std::map<int32_t, StageProfile> profiles = ProfileChunks(flags, run);
  const AfterRuns after = MeasurePeaksAfter(run);
  Report(flags, run, reporter, after, profiles);
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace centroidkv::bench

int main(int argc, char** argv) { return centroidkv::bench::Main(argc, argv); }
