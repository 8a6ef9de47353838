// The Prometheus text exposition format (0.0.4) for the metric families of metrics.h.
#include "service/metrics.h"

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

namespace centroidkv::service {
namespace {

[[maybe_unused]] bool IsMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// HELP text escapes backslash and newline; label values also escape the double quote.
std::string Escape(const std::string& text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return error == std::errc() ? std::string(buffer, end) : "NaN";
}

// ---------------------------------------------------------------------------------------
// Histogram.

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {
  assert(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::Observe(double value) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++buckets_[bucket];
  ++count_;
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (const uint64_t n : buckets_) {
    running += n;
    snapshot.cumulative.push_back(running);
  }
  snapshot.count = count_;
  snapshot.sum = sum_;
  return snapshot;
}

// ---------------------------------------------------------------------------------------
// Families.

MetricFamily::MetricFamily(std::string name, std::string help,
                           std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

void MetricFamily::Render(std::string* out) const {
  *out += "# HELP " + name_ + " " + Escape(help_, /*quote=*/false) + "\n";
  *out += "# TYPE " + name_ + " " + type() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  RenderSeries(out);
}

std::string MetricFamily::LabelText(const LabelValues& values, const std::string& extra) const {
  assert(values.size() == label_names_.size());
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) {
    text += (text.empty() ? "" : ",") + label_names_[i] + "=\"" + Escape(values[i], true) + "\"";
  }
  if (!extra.empty()) text += (text.empty() ? "" : ",") + extra;
  return text.empty() ? text : "{" + text + "}";
}

Counter* CounterFamily::WithLabels(const LabelValues& label_values) {
  assert(label_values.size() == label_names_.size());
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Counter>& counter = series_[label_values];
  if (counter == nullptr) counter = std::make_unique<Counter>();
  return counter.get();
}

uint64_t CounterFamily::Total() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [values, counter] : series_) total += counter->value();
  return total;
}

void CounterFamily::RenderSeries(std::string* out) const {
  for (const auto& [values, counter] : series_) {
    *out += name_ + LabelText(values) + " " + std::to_string(counter->value()) + "\n";
  }
}

void GaugeFamily::Add(const LabelValues& label_values, std::function<double()> read) {
  assert(label_values.size() == label_names_.size());
  std::lock_guard<std::mutex> lock(mu_);
  series_[label_values] = std::move(read);
}

void GaugeFamily::RenderSeries(std::string* out) const {
  for (const auto& [values, read] : series_) {
    *out += name_ + LabelText(values) + " " + FormatMetricValue(read()) + "\n";
  }
}

HistogramFamily::HistogramFamily(std::string name, std::string help,
                                 std::vector<std::string> label_names, std::vector<double> bounds)
    : MetricFamily(std::move(name), std::move(help), std::move(label_names)),
      bounds_(std::move(bounds)) {}

Histogram* HistogramFamily::WithLabels(const LabelValues& label_values) {
  assert(label_values.size() == label_names_.size());
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Histogram>& histogram = series_[label_values];
  if (histogram == nullptr) histogram = std::make_unique<Histogram>(bounds_);
  return histogram.get();
}

void HistogramFamily::RenderSeries(std::string* out) const {
  for (const auto& [values, histogram] : series_) {
    const Histogram::Snapshot snapshot = histogram->snapshot();
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      const double bound =
          i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
      *out += name_ + "_bucket" +
              LabelText(values, "le=\"" + FormatMetricValue(bound) + "\"") + " " +
              std::to_string(snapshot.cumulative[i]) + "\n";
    }
    *out += name_ + "_sum" + LabelText(values) + " " + FormatMetricValue(snapshot.sum) + "\n";
    *out += name_ + "_count" + LabelText(values) + " " + std::to_string(snapshot.count) + "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Registry.

template <typename Family, typename... Args>
Family* MetricsRegistry::Register(Args&&... args) {
  auto family = std::make_unique<Family>(std::forward<Args>(args)...);
  assert(IsMetricName(family->name()));
  assert(std::none_of(families_.begin(), families_.end(),
                      [&](const auto& f) { return f->name() == family->name(); }));
  Family* raw = family.get();
  families_.push_back(std::move(family));
  return raw;
}

CounterFamily* MetricsRegistry::AddCounter(std::string name, std::string help,
                                           std::vector<std::string> label_names) {
  return Register<CounterFamily>(std::move(name), std::move(help), std::move(label_names));
}

GaugeFamily* MetricsRegistry::AddGauge(std::string name, std::string help,
                                       std::vector<std::string> label_names) {
  return Register<GaugeFamily>(std::move(name), std::move(help), std::move(label_names));
}

HistogramFamily* MetricsRegistry::AddHistogram(std::string name, std::string help,
                                               std::vector<std::string> label_names,
                                               std::vector<double> bounds) {
  return Register<HistogramFamily>(std::move(name), std::move(help), std::move(label_names),
                                   std::move(bounds));
}

std::string MetricsRegistry::Render() const {
  std::string out;
  for (const auto& family : families_) family->Render(&out);
  return out;
}

}  // namespace centroidkv::service
