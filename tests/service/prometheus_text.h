// Test helpers for /metrics: a strict parser of the Prometheus text exposition format
// (0.0.4) that also checks histogram invariants, and a scrape over HTTP with cpp-httplib's
// client (the library the server uses).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace centroidkv::service::testing {

struct PromSample {
  std::string name;                           // e.g. "x_bucket" for histogram family "x"
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0.0;
};

struct PromFamily {
  std::string help;
  std::string type;  // counter, gauge, histogram, summary or untyped
  std::vector<PromSample> samples;
};

// Parses `text`, rejecting what the format forbids: a metric or label name outside its
// grammar, a bad escape or value, HELP/TYPE repeated or after the family's samples, a
// sample outside the family declared just before it, duplicate series, a negative or
// NaN counter, and histograms whose buckets are not `le`-increasing, cumulative, ending
// with le="+Inf" equal to _count, or lack _sum/_count.
absl::StatusOr<std::map<std::string, PromFamily>> ParsePrometheusText(const std::string& text);

// The value of the one sample of `family` named `name` whose labels include `labels`;
// NOT_FOUND if there is none, FAILED_PRECONDITION if several match.
absl::StatusOr<double> SampleValue(const std::map<std::string, PromFamily>& families,
                                   const std::string& family, const std::string& name,
                                   const std::map<std::string, std::string>& labels = {});

// GET http://127.0.0.1:port/metrics; the body, or an error naming the HTTP failure. Also
// checks the Content-Type is the exposition format's.
absl::StatusOr<std::string> ScrapeMetrics(int port);

}  // namespace centroidkv::service::testing
