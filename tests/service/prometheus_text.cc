// A strict Prometheus text-format parser for tests, and the HTTP scrape.
#include "tests/service/prometheus_text.h"

#include <httplib.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace centroidkv::service::testing {
namespace {

bool IsNameStart(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
bool IsNameChar(char c, bool colon) { return IsNameStart(c, colon) || (c >= '0' && c <= '9'); }

// Reads a name at text[*pos] ([a-zA-Z_:][a-zA-Z0-9_:]* for metrics, no ':' for labels).
bool ReadName(const std::string& text, size_t* pos, bool colon, std::string* name) {
  const size_t start = *pos;
  if (*pos >= text.size() || !IsNameStart(text[*pos], colon)) return false;
  while (*pos < text.size() && IsNameChar(text[*pos], colon)) ++*pos;
  *name = text.substr(start, *pos - start);
  return true;
}

bool ParseValue(const std::string& text, double* value) {
  if (text == "+Inf" || text == "Inf") {
    *value = std::numeric_limits<double>::infinity();
  } else if (text == "-Inf") {
    *value = -std::numeric_limits<double>::infinity();
  } else if (text == "NaN") {
    *value = std::numeric_limits<double>::quiet_NaN();
  } else {
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    if (!text.empty() && text[0] == '+') ++begin;
    const auto [ptr, error] = std::from_chars(begin, end, *value);
    return !text.empty() && error == std::errc() && ptr == end;
  }
  return true;
}

// `{a="x",b="y"}` at text[*pos] (pos on '{'), with \\, \" and \n escapes.
absl::Status ReadLabels(const std::string& line, size_t* pos,
                        std::map<std::string, std::string>* labels) {
  ++*pos;  // '{'
  while (*pos < line.size() && line[*pos] != '}') {
    std::string name;
    if (!ReadName(line, pos, /*colon=*/false, &name)) {
      return absl::InvalidArgumentError(absl::StrCat("bad label name in: ", line));
    }
    if (*pos + 1 >= line.size() || line[*pos] != '=' || line[*pos + 1] != '"') {
      return absl::InvalidArgumentError(absl::StrCat("expected =\" after label ", name));
    }
    *pos += 2;
    std::string value;
    while (*pos < line.size() && line[*pos] != '"') {
      if (line[*pos] == '\\') {
        if (*pos + 1 >= line.size()) return absl::InvalidArgumentError("dangling escape");
        const char next = line[*pos + 1];
        if (next == '\\' || next == '"') {
          value += next;
        } else if (next == 'n') {
          value += '\n';
        } else {
          return absl::InvalidArgumentError(absl::StrCat("bad escape in: ", line));
        }
        *pos += 2;
      } else {
        value += line[(*pos)++];
      }
    }
    if (*pos >= line.size()) return absl::InvalidArgumentError("unterminated label value");
    ++*pos;  // closing quote
    if (!labels->emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("label ", name, " repeated in: ", line));
    }
    if (*pos < line.size() && line[*pos] == ',') ++*pos;
  }
  if (*pos >= line.size()) return absl::InvalidArgumentError("unterminated label set");
  ++*pos;  // '}'
  return absl::OkStatus();
}

// Histogram invariants for one series (the labels other than le).
absl::Status CheckHistogram(const std::string& family, const PromFamily& data) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    std::optional<double> count, sum;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const PromSample& sample : data.samples) {
    std::map<std::string, std::string> labels = sample.labels;
    if (sample.name == family + "_bucket") {
      auto le = labels.find("le");
      double bound = 0;
      if (le == labels.end() || !ParseValue(le->second, &bound)) {
        return absl::InvalidArgumentError(absl::StrCat(family, ": bucket without a valid le"));
      }
      labels.erase(le);
      series[labels].buckets.emplace_back(bound, sample.value);
    } else if (sample.name == family + "_count") {
      series[labels].count = sample.value;
    } else if (sample.name == family + "_sum") {
      series[labels].sum = sample.value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(family, ": unexpected sample ", sample.name));
    }
  }
  for (const auto& [labels, s] : series) {
    if (!s.count.has_value() || !s.sum.has_value() || s.buckets.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(family, ": series lacks _count, _sum or buckets"));
    }
    for (size_t i = 1; i < s.buckets.size(); ++i) {
      if (!(s.buckets[i].first > s.buckets[i - 1].first) ||
          s.buckets[i].second < s.buckets[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat(family, ": buckets not increasing in le or not cumulative"));
      }
    }
    if (!std::isinf(s.buckets.back().first) || s.buckets.back().second != *s.count) {
      return absl::InvalidArgumentError(
          absl::StrCat(family, ": last bucket must be le=\"+Inf\" and equal _count"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, PromFamily>> ParsePrometheusText(const std::string& text) {
  if (text.empty() || text.back() != '\n') {
    return absl::InvalidArgumentError("the exposition must end with a newline");
  }
  std::map<std::string, PromFamily> families;
  std::set<std::string> closed;  // families whose samples are over
  std::string current;           // the family of the last HELP/TYPE/sample
  std::set<std::string> series_seen;
  std::vector<std::string> lines = absl::StrSplit(text.substr(0, text.size() - 1), '\n');
  for (const std::string& line : lines) {
    if (line.empty()) return absl::InvalidArgumentError("empty line");
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const bool help = line[2] == 'H';
      size_t pos = 7;
      std::string name;
      if (!ReadName(line, &pos, /*colon=*/true, &name) || pos >= line.size() || line[pos] != ' ') {
        return absl::InvalidArgumentError(absl::StrCat("bad metric name in: ", line));
      }
      const std::string rest = line.substr(pos + 1);
      if (name != current) {
        if (!current.empty()) closed.insert(current);
        if (closed.count(name)) {
          return absl::InvalidArgumentError(absl::StrCat(name, ": declared after its samples"));
        }
        current = name;
      }
      PromFamily& family = families[name];
      if (!family.samples.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": HELP/TYPE after samples"));
      }
      if (help) {
        if (!family.help.empty()) return absl::InvalidArgumentError(name + ": HELP repeated");
        family.help = rest;
      } else {
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                     "untyped"};
        if (!family.type.empty()) return absl::InvalidArgumentError(name + ": TYPE repeated");
        if (!kTypes.count(rest)) return absl::InvalidArgumentError(name + ": bad TYPE " + rest);
        family.type = rest;
      }
      continue;
    }
    if (line[0] == '#') continue;  // a plain comment
    PromSample sample;
    size_t pos = 0;
    if (!ReadName(line, &pos, /*colon=*/true, &sample.name)) {
      return absl::InvalidArgumentError(absl::StrCat("bad sample name in: ", line));
    }
    if (pos < line.size() && line[pos] == '{') {
      if (absl::Status status = ReadLabels(line, &pos, &sample.labels); !status.ok()) {
        return status;
      }
    }
    if (pos >= line.size() || line[pos] != ' ') {
      return absl::InvalidArgumentError(absl::StrCat("expected a space before the value: ", line));
    }
    const std::string value = line.substr(pos + 1);
    if (value.find(' ') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected timestamp or text: ", line));
    }
    if (!ParseValue(value, &sample.value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value in: ", line));
    }
    auto family = families.find(current);
    const bool histogram = family != families.end() && family->second.type == "histogram";
    const bool belongs =
        sample.name == current ||
        (histogram && (sample.name == current + "_bucket" || sample.name == current + "_sum" ||
                       sample.name == current + "_count"));
    if (family == families.end() || family->second.type.empty() || !belongs) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample ", sample.name, " outside a declared family (current: ", current, ")"));
    }
    if (family->second.type == "counter" && (std::isnan(sample.value) || sample.value < 0)) {
      return absl::InvalidArgumentError(absl::StrCat("negative or NaN counter: ", line));
    }
    if (!series_seen.insert(line.substr(0, pos)).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate series: ", line));
    }
    family->second.samples.push_back(std::move(sample));
  }
  for (const auto& [name, family] : families) {
    if (family.type.empty()) return absl::InvalidArgumentError(name + ": no TYPE");
    if (family.type == "histogram") {
      if (absl::Status status = CheckHistogram(name, family); !status.ok()) return status;
    }
  }
  return families;
}

absl::StatusOr<double> SampleValue(const std::map<std::string, PromFamily>& families,
                                   const std::string& family, const std::string& name,
                                   const std::map<std::string, std::string>& labels) {
  auto it = families.find(family);
  if (it == families.end()) return absl::NotFoundError(absl::StrCat("no family ", family));
  std::optional<double> found;
  for (const PromSample& sample : it->second.samples) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto label = sample.labels.find(key);
      match = match && label != sample.labels.end() && label->second == value;
    }
    if (!match) continue;
    if (found.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("several samples of ", name, " match"));
    }
    found = sample.value;
  }
  if (!found.has_value()) return absl::NotFoundError(absl::StrCat("no sample ", name));
  return *found;
}

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("GET /metrics: ", httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET /metrics: HTTP ", result->status));
  }
  const std::string type = result->get_header_value("Content-Type");
  if (type.rfind("text/plain; version=0.0.4", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GET /metrics: Content-Type ", type));
  }
  return result->body;
}

}  // namespace centroidkv::service::testing
