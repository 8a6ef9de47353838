// centroidkv-bench, the command (BenchMain, bench/service/load.h): the flags parsed into a
// config (load_flags.cc), the runs it asks for (load_run.cc) with a progress bar on stderr,
// and their report (load_report.cc) with the exit code.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/service/load.h"
#include "centroidkv/types/kinds.h"

namespace centroidkv::bench {
namespace {

// A progress bar on stderr for the run named `label`, or none when not `show`n.
ProgressFn ProgressBar(std::ostream& err, bool show, std::string label) {
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
}

// Every run of the command, in the order printed; with --compare also each leg's runs.
struct Runs {
  std::vector<RunStats> all;
  std::vector<RunStats> service, floor, in_process, shm, shm_floor;
};

// One run with the configured backend, or with --compare the rounds of the three legs.
Runs RunConfigured(const LoadConfig& config, const Dataset& data, std::ostream& err,
                   bool show) {
  Runs runs;
  if (config.compare) {
    // The in-process engine gets the server's clustering threads unless --threads says.
    const int32_t threads = config.threads > 0 ? config.threads : ServerThreads(config);
    // Rounds of the three legs in turn, so that a change in the machine's load falls on
    // all three; the JSON line takes each leg's median over the rounds.
    for (int32_t round = 1; round <= config.rounds; ++round) {
      const std::string tag = config.rounds > 1 ? absl::StrCat(" #", round) : "";
      runs.service.push_back(RunService(config, data, BackendKind::kCpu,
                                        ProgressBar(err, show, "service:cpu" + tag)));
      runs.floor.push_back(RunService(config, data, BackendKind::kIdentity,
                                      ProgressBar(err, show, "service:identity" + tag)));
      runs.in_process.push_back(RunInProcess(config, data, BackendKind::kCpu, threads,
                                             ProgressBar(err, show, "in-process:cpu" + tag)));
      std::vector<RunStats*> legs = {&runs.service.back(), &runs.floor.back(),
                                     &runs.in_process.back()};
      if (config.shm) {
        runs.shm.push_back(RunService(config, data, BackendKind::kCpu,
                                      ProgressBar(err, show, "service:cpu+shm" + tag),
                                      /*shm=*/true));
        legs.push_back(&runs.shm.back());
        // The transport floor over shm: what is left of the transport once the tensors
        // stay in the region (the header round trip and the server's copies).
        runs.shm_floor.push_back(RunService(config, data, BackendKind::kIdentity,
                                            ProgressBar(err, show, "service:identity+shm" + tag),
                                            /*shm=*/true));
        legs.push_back(&runs.shm_floor.back());
      }
      for (RunStats* run : legs) {
        run->label += tag;
        runs.all.push_back(*run);
      }
    }
  } else {
    runs.all.push_back(RunService(
        config, data, config.backend,
        ProgressBar(err, show,
                    absl::StrCat("service:", std::string(BackendKindName(config.backend)),
                                 config.shm ? "+shm" : "")),
        config.shm));
  }
  return runs;
}

// --decode: per round, both load shapes, each through the in-process engine, the service
// over slabs and (with --shm) over shared memory, in turn, so that a change in the machine's
// load falls on every leg.
struct DecodeRuns {
  DecodeLegs throughput, latency;
  std::vector<RunStats> all;
};

DecodeRuns RunDecode(const LoadConfig& config, const Dataset& data, std::ostream& err,
                     bool show) {
  DecodeRuns runs;
  const int32_t threads = config.threads > 0 ? config.threads : ServerThreads(config);
  LoadConfig one_at_a_time = config;
  one_at_a_time.concurrency = 1;
  one_at_a_time.pipeline = 1;
  const std::pair<const LoadConfig*, DecodeLegs*> shapes[] = {{&config, &runs.throughput},
                                                              {&one_at_a_time, &runs.latency}};
  for (const auto& [shape, legs] : shapes) {
    legs->concurrency = shape->concurrency;
    legs->pipeline = shape->pipeline;
  }
  for (int32_t round = 1; round <= config.rounds; ++round) {
    const std::string tag = config.rounds > 1 ? absl::StrCat(" #", round) : "";
    for (const auto& [shape, legs] : shapes) {
      const std::string name =
          absl::StrCat("decode ", shape->concurrency, "x", shape->pipeline, " ");
      legs->in_process.push_back(RunInProcess(*shape, data, BackendKind::kCpu, threads,
                                              ProgressBar(err, show, name + "in-process" + tag)));
      std::vector<RunStats*> done = {&legs->in_process.back()};
      legs->slabs.push_back(RunService(*shape, data, BackendKind::kCpu,
                                       ProgressBar(err, show, name + "service" + tag)));
      done.push_back(&legs->slabs.back());
      if (config.shm) {
        legs->shm.push_back(RunService(*shape, data, BackendKind::kCpu,
                                       ProgressBar(err, show, name + "service+shm" + tag),
                                       /*shm=*/true));
        done.push_back(&legs->shm.back());
      }
      for (RunStats* run : done) {
        run->label = name + run->label + tag;
        runs.all.push_back(*run);
      }
    }
  }
  return runs;
}

// 1 when a run lost jobs, broke off, or did none; else 0.
int ExitCode(const std::vector<RunStats>& runs) {
  for (const RunStats& run : runs) {
    if (run.jobs_failed() > 0 || !run.fatal.empty() || run.records.empty()) return 1;
  }
  return 0;
}

}  // namespace

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
  if (show) err << "generating " << config->distinct_layers << " layers of synthetic KV...\n";
  const Dataset data = MakeDataset(*config);
  if (config->decode) {
    const DecodeRuns runs = RunDecode(*config, data, err, show);
    PrintStats(*config, runs.all, out);
    out << DecodeJson(*config, runs.throughput, runs.latency) << "\n";
    return ExitCode(runs.all);
  }
  const Runs runs = RunConfigured(*config, data, err, show);
  PrintStats(*config, runs.all, out);
  if (config->compare) {
    out << CompareJson(*config, runs.service, runs.floor, runs.in_process, runs.shm,
                       runs.shm_floor)
        << "\n";
  }
  return ExitCode(runs.all);
}

}  // namespace centroidkv::bench
