// centroidkv-bench's report (bench/service/load.h): what the job records add up to
// (throughput, compression, latency percentiles, queue and compute means, errors), printed
// as text, JSON or CSV, and the --compare line.
#include <functional>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/service/load.h"
#include "centroidkv/common/dtype.h"

namespace centroidkv::bench {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

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
double RunStats::jobs_per_s() const {
  return wall_s > 0 ? static_cast<double>(jobs_ok()) / wall_s : 0.0;
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

void PrintStats(const LoadConfig& config, const std::vector<RunStats>& runs, std::ostream& out) {
  // A run's own shape (--decode runs two), else the configured one.
  auto streams = [&](const RunStats& s) { return s.concurrency > 0 ? s.concurrency : config.concurrency; };
  auto in_flight = [&](const RunStats& s) { return s.pipeline > 0 ? s.pipeline : config.pipeline; };
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
                 JsonString(std::string(DTypeName(config.dtype))), streams(s),
                 in_flight(s), s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
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
          streams(s), in_flight(s), s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
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
        "  jobs:          %d ok, %d failed in %.3f s (%.1f jobs/s)\n"
        "  throughput:    %.4g layer-head tokens/s, %.3f GB/s of KV in\n"
        "  compression:   %.4f entries out / in\n"
        "  latency/job:   p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  mean %.2f ms\n"
        "  of which:      queue %.2f ms + compute %.2f ms (means; the rest is transport)\n",
        s.label, config.preset.name, config.preset.layers, config.preset.kv_heads,
        config.preset.head_dim, config.context, std::string(DTypeName(config.dtype)),
        streams(s), in_flight(s), s.threads, s.jobs_ok(), s.jobs_failed(), s.wall_s,
        s.jobs_per_s(), s.tokens_per_s(), s.gb_per_s(), s.compression(), s.latency_ms(0.5),
        s.latency_ms(0.9), s.latency_ms(0.99), s.mean_latency_ms(), s.mean_queue_ms(),
        s.mean_compute_ms());
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
                        const std::vector<RunStats>& in_process,
                        const std::vector<RunStats>& shm,
                        const std::vector<RunStats>& shm_floor) {
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
  std::string shm_fields;
  if (!shm.empty()) {
    // The shared memory leg against the in-process engine and the slab path.
    const double m = MedianTokensPerS(shm);
    std::vector<std::string> shm_per_round;
    for (size_t r = 0; r < std::min(shm.size(), in_process.size()); ++r) {
      const double engine = in_process[r].tokens_per_s();
      shm_per_round.push_back(
          absl::StrFormat("%.4f", engine > 0 ? shm[r].tokens_per_s() / engine : 0.0));
    }
    shm_fields = absl::StrFormat(
        ",\"shm_tokens_per_s\":%.1f,\"shm_ratio_to_in_process\":%.4f,"
        "\"shm_ratio_to_slabs\":%.4f,\"shm_ratio_to_in_process_per_round\":[%s]",
        m, p > 0 ? m / p : 0.0, s > 0 ? m / s : 0.0, absl::StrJoin(shm_per_round, ","));
  }
  if (!shm_floor.empty()) {
    const double m = MedianTokensPerS(shm_floor);
    absl::StrAppendFormat(&shm_fields,
                          ",\"shm_floor_tokens_per_s\":%.1f,\"shm_floor_ratio_to_floor\":%.4f", m,
                          f > 0 ? m / f : 0.0);
  }
  return absl::StrFormat(
      "{\"preset\":%s,\"context\":%d,\"concurrency\":%d,\"pipeline\":%d,"
      "\"server_threads\":%d,\"in_process_threads\":%d,\"rounds\":%d,"
      "\"service_tokens_per_s\":%.1f,\"floor_tokens_per_s\":%.1f,"
      "\"in_process_tokens_per_s\":%.1f,\"serial_bound_tokens_per_s\":%.1f,"
      "\"ratio_to_serial_bound\":%.4f,\"ratio_per_round\":[%s]%s}",
      JsonString(config.preset.name), config.context, config.concurrency, config.pipeline,
      service.empty() ? 0 : service[0].threads, in_process.empty() ? 0 : in_process[0].threads,
      rounds, s, f, p, bound, ratio, absl::StrJoin(per_round, ","), shm_fields);
}

namespace {

// The median over rounds of one statistic of a leg's runs.
double MedianOf(const std::vector<RunStats>& runs, const std::function<double(const RunStats&)>& f) {
  std::vector<double> values;
  for (const RunStats& run : runs) values.push_back(f(run));
  return Percentile(std::move(values), 0.5);
}

struct LegSummary {
  double jobs_per_s = 0, tokens_per_s = 0, p50_ms = 0, p99_ms = 0;
};

LegSummary Summarize(const std::vector<RunStats>& runs) {
  return {MedianOf(runs, [](const RunStats& r) { return r.jobs_per_s(); }),
          MedianOf(runs, [](const RunStats& r) { return r.tokens_per_s(); }),
          MedianOf(runs, [](const RunStats& r) { return r.latency_ms(0.5); }),
          MedianOf(runs, [](const RunStats& r) { return r.latency_ms(0.99); })};
}

std::string LegJson(const LegSummary& leg) {
  return absl::StrFormat("{\"jobs_per_s\":%.3f,\"tokens_per_s\":%.1f,\"p50_ms\":%.4f,"
                         "\"p99_ms\":%.4f}",
                         leg.jobs_per_s, leg.tokens_per_s, leg.p50_ms, leg.p99_ms);
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// One load shape: its legs and the ratios to the in-process engine.
std::string ShapeJson(const DecodeLegs& legs) {
  const LegSummary engine = Summarize(legs.in_process);
  std::string out = absl::StrFormat("{\"concurrency\":%d,\"pipeline\":%d,\"in_process\":%s",
                                    legs.concurrency, legs.pipeline, LegJson(engine));
  const std::pair<const char*, const std::vector<RunStats>*> services[] = {
      {"slabs", &legs.slabs}, {"shm", &legs.shm}};
  for (const auto& [name, runs] : services) {
    if (runs->empty()) continue;
    const LegSummary leg = Summarize(*runs);
    absl::StrAppendFormat(&out,
                          ",\"%s\":%s,\"%s_tokens_ratio_to_in_process\":%.4f,"
                          "\"%s_p99_ratio_to_in_process_p99\":%.4f,"
                          "\"%s_p99_ratio_to_in_process_p50\":%.4f",
                          name, LegJson(leg), name, Ratio(leg.tokens_per_s, engine.tokens_per_s),
                          name, Ratio(leg.p99_ms, engine.p99_ms), name,
                          Ratio(leg.p99_ms, engine.p50_ms));
  }
  return out + "}";
}

}  // namespace

std::string DecodeJson(const LoadConfig& config, const DecodeLegs& throughput,
                       const DecodeLegs& latency) {
  return absl::StrFormat(
      "{\"decode\":{\"preset\":%s,\"heads\":%d,\"head_dim\":%d,\"new_tokens\":%d,"
      "\"dtype\":%s,\"rounds\":%d,\"server_threads\":%d,\"in_process_threads\":%d,"
      "\"throughput\":%s,\"latency\":%s}}",
      JsonString(config.preset.name), config.preset.kv_heads, config.preset.head_dim,
      config.context, JsonString(std::string(DTypeName(config.dtype))), config.rounds,
      throughput.slabs.empty() ? 0 : throughput.slabs[0].threads,
      throughput.in_process.empty() ? 0 : throughput.in_process[0].threads,
      ShapeJson(throughput), ShapeJson(latency));
}

}  // namespace centroidkv::bench
