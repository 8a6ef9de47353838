// The per-stage profile (stage_profile.h): perf attached to this process, its report grouped.
#include "bench/stage_profile.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace centroidkv::bench {
namespace {

// (stage, substrings of the symbol); the first stage with a match wins, so the specific
// stages come before the general ones.
const std::vector<std::pair<std::string, std::vector<std::string_view>>>& Rules() {
  static const auto* rules = new std::vector<std::pair<std::string, std::vector<std::string_view>>>{
      {"match kernel", {"MatchRows", "MatchInt16", "MatchTile", "MatchBf16x3", "AmxMatch",
                        "QuantizeRows", "MatchRest"}},
      {"near-tie rescoring (exact cosines, edge decisions)",
       {"ScoreRow", "CosinesOfWidened", "ExactScorer", "ResolveChunkEdges", "OrderSources",
        "SortSmall", "KeepBest", "nextafter", "RescoreSource", "ExactCosine"}},
      {"widening and panel packing", {"WidenRows", "PackPanels", "Transpose", "InverseNorms",
                                      "SplitRows"}},
      {"input check (NaN/Inf)", {"NoneAllOnes", "RowsFinite", "CheckInputRows"}},
      {"fp8 conversions", {"WidenFp8", "NarrowToFp8", "MaxMagnitude", "Fp8"}},
      {"merges and row copies", {"MergeRow", "MergeTerms", "MeanOfPair", "MergeChunk",
                                 "WriteRow", "BucketSources", "ConvertRow", "WriteCount",
                                 "WriteProtectedRows", "FinishHead", "ShiftInPlace"}},
      {"result streaming", {"StreamFloats", "StreamHalves", "BlockWriter", "WriteOutputRows",
                            "FinalizeHead"}},
      {"memcpy, memset", {"memmove", "memcpy", "memset"}},
  };
  return *rules;
}

constexpr std::string_view kKernelStage = "kernel (page faults, scheduling, syscalls)";
constexpr std::string_view kOtherStage = "job set-up, oneTBB, allocation, other";

}  // namespace

const std::vector<std::string>& StageNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>();
    for (const auto& [stage, substrings] : Rules()) out->push_back(stage);
    out->emplace_back(kKernelStage);
    out->emplace_back(kOtherStage);
    return out;
  }();
  return *names;
}

const std::string& StageOf(const std::string& symbol) {
  const std::vector<std::string>& names = StageNames();
  if (symbol.rfind("[k]", 0) == 0) return names[names.size() - 2];
  const std::vector<std::pair<std::string, std::vector<std::string_view>>>& rules = Rules();
  for (size_t i = 0; i < rules.size(); ++i) {
    for (std::string_view part : rules[i].second) {
      if (symbol.find(part) != std::string::npos) return names[i];
    }
  }
  return names.back();
}

absl::StatusOr<StageProfile> ProfileStages(const std::function<absl::Status()>& job,
                                           double seconds, int frequency,
                                           const std::string& perf_data) {
  const std::string pid = std::to_string(getpid());
  const std::string freq = std::to_string(frequency);
  const std::string log = perf_data + ".log";
  std::vector<std::string> args = {"perf", "record", "-q", "-F", freq, "-p", pid, "-o", perf_data};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t perf = 0;
  const int spawned = posix_spawnp(&perf, "perf", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::FailedPreconditionError("--profile_seconds needs perf (linux-perf): cannot run it");
  }
  // perf attaches within a few milliseconds; one that cannot (perf_event_paranoid) exits.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int wait_status = 0;
  if (waitpid(perf, &wait_status, WNOHANG) == perf) {
    return absl::FailedPreconditionError(
        absl::StrCat("perf record exited at once (see ", log, ")"));
  }
  StageProfile profile;
  profile.perf_data = perf_data;
  absl::Status job_status;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    job_status = job();
    if (!job_status.ok()) break;
    ++profile.jobs;
  }
  kill(perf, SIGINT);
  waitpid(perf, &wait_status, 0);
  if (!job_status.ok()) return job_status;

  const std::string command = absl::StrCat("perf report -i '", perf_data,
                                           "' -n --no-children --sort sym --stdio 2>/dev/null");
  std::unique_ptr<FILE, int (*)(FILE*)> report(popen(command.c_str(), "r"), pclose);
  if (report == nullptr) return absl::InternalError("cannot run perf report");
  std::map<std::string, int64_t> by_stage;
  char buffer[8192];
  while (std::fgets(buffer, sizeof(buffer), report.get()) != nullptr) {
    // "    23.04%     12345  [.] symbol"
    absl::string_view line = absl::StripAsciiWhitespace(buffer);
    if (line.empty() || line[0] == '#') continue;
    const size_t percent = line.find('%');
    if (percent == absl::string_view::npos) continue;
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(percent + 1));
    const size_t space = rest.find(' ');
    int64_t samples = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, space), &samples)) {
      continue;
    }
    const std::string symbol(absl::StripLeadingAsciiWhitespace(rest.substr(space)));
    by_stage[StageOf(symbol)] += samples;
    profile.samples += samples;
  }
  if (profile.samples == 0) {
    return absl::InternalError(absl::StrCat("perf recorded no samples (see ", log, ")"));
  }
  for (const std::string& stage : StageNames()) {
    profile.stages.push_back(
        {stage, static_cast<double>(by_stage[stage]) / static_cast<double>(profile.samples)});
  }
  return profile;
}

}  // namespace centroidkv::bench
