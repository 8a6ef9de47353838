// A small registry of Prometheus metrics (counters, callback gauges, histograms, each a
// family of series keyed by label values) and their text exposition format 0.0.4. The
// only place that knows the format: ServiceMetrics says which metrics exist,
// MetricsHttpServer serves Render().
// Thread-safe: families are registered at start-up (before Render is called from another
// thread); series are created on first use under their family's lock, and their
// pointers stay valid for the registry's life.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace centroidkv::service {

class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    uint64_t count = 0;
    double sum = 0.0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> buckets_;  // per bound, then +Inf; not cumulative
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

// One metric name with its HELP and TYPE, and its series.
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~MetricFamily() = default;
  // Appends "# HELP", "# TYPE" and one line per sample (series in label order).
  void Render(std::string* out) const;
  const std::string& name() const { return name_; }

 protected:
  using LabelValues = std::vector<std::string>;
  virtual const char* type() const = 0;
  virtual void RenderSeries(std::string* out) const = 0;
  // `{a="x",b="y"}` for `values` (plus `extra`, e.g. le="0.5"); empty for no labels.
  std::string LabelText(const LabelValues& values, const std::string& extra = "") const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;
};

class CounterFamily final : public MetricFamily {
 public:
  using MetricFamily::MetricFamily;
  // The series for `label_values` (one per label name), created at zero on first use.
  Counter* WithLabels(const LabelValues& label_values);
  // The sum over every series (a family without labels: its one value).
  uint64_t Total() const;

 private:
  const char* type() const override { return "counter"; }
  void RenderSeries(std::string* out) const override;
  std::map<LabelValues, std::unique_ptr<Counter>> series_;
};

// Gauges whose value is read when scraped (live state: streams open, queue depth).
class GaugeFamily final : public MetricFamily {
 public:
  using MetricFamily::MetricFamily;
  void Add(const LabelValues& label_values, std::function<double()> read);

 private:
  const char* type() const override { return "gauge"; }
  void RenderSeries(std::string* out) const override;
  std::map<LabelValues, std::function<double()>> series_;
};

class HistogramFamily final : public MetricFamily {
 public:
  HistogramFamily(std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> bounds);
  Histogram* WithLabels(const LabelValues& label_values);

 private:
  const char* type() const override { return "histogram"; }
  void RenderSeries(std::string* out) const override;
  const std::vector<double> bounds_;
  std::map<LabelValues, std::unique_ptr<Histogram>> series_;
};

class MetricsRegistry {
 public:
  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]* and be unique (asserted).
  CounterFamily* AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {});
  GaugeFamily* AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {});
  HistogramFamily* AddHistogram(std::string name, std::string help,
                                std::vector<std::string> label_names, std::vector<double> bounds);
  // The whole registry in the text exposition format, families in registration order.
  std::string Render() const;

 private:
  template <typename Family, typename... Args>
  Family* Register(Args&&... args);
  std::vector<std::unique_ptr<MetricFamily>> families_;
};

// The value as Prometheus writes it: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string FormatMetricValue(double value);

}  // namespace centroidkv::service
