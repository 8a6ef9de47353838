// The metric registry's text exposition format, checked by the strict parser of
// prometheus_text.h; and the parser itself, which must reject what the format forbids.
#include "service/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/service/prometheus_text.h"

namespace centroidkv::service::testing {
namespace {

TEST(MetricsTest, RendersCountersGaugesAndHistogramsInTheExpositionFormat) {
  MetricsRegistry registry;
  CounterFamily* jobs = registry.AddCounter("ckv_jobs_total", "Jobs \\ seen\nso far", {"backend"});
  jobs->WithLabels({"cpu"})->Increment(3);
  jobs->WithLabels({"we\"ird\\\n"})->Increment();
  double depth = 2.5;
  registry.AddGauge("ckv_depth", "Depth")->Add({}, [&depth] { return depth; });
  Histogram* seconds =
      registry.AddHistogram("ckv_seconds", "Time", {"backend"}, {0.001, 0.01, 0.1})
          ->WithLabels({"cpu"});
  for (const double v : {0.0005, 0.001, 0.002, 0.05, 0.05, 7.0}) seconds->Observe(v);

  const std::string text = registry.Render();
  auto families = ParsePrometheusText(text);
  ASSERT_TRUE(families.ok()) << families.status() << "\n" << text;
  EXPECT_EQ(families->at("ckv_jobs_total").type, "counter");
  EXPECT_EQ(families->at("ckv_jobs_total").help, "Jobs \\\\ seen\\nso far");
  EXPECT_EQ(*SampleValue(*families, "ckv_jobs_total", "ckv_jobs_total", {{"backend", "cpu"}}), 3);
  EXPECT_EQ(*SampleValue(*families, "ckv_jobs_total", "ckv_jobs_total",
                         {{"backend", "we\"ird\\\n"}}),
            1);
  EXPECT_EQ(*SampleValue(*families, "ckv_depth", "ckv_depth"), 2.5);
  // le is inclusive: 0.001 falls in the first bucket.
  const auto bucket = [&](const char* le) {
    return *SampleValue(*families, "ckv_seconds", "ckv_seconds_bucket", {{"le", le}});
  };
  EXPECT_EQ(bucket("0.001"), 2);
  EXPECT_EQ(bucket("0.01"), 3);
  EXPECT_EQ(bucket("0.1"), 5);
  EXPECT_EQ(bucket("+Inf"), 6);
  EXPECT_EQ(*SampleValue(*families, "ckv_seconds", "ckv_seconds_count"), 6);
  EXPECT_NEAR(*SampleValue(*families, "ckv_seconds", "ckv_seconds_sum"), 7.1035, 1e-12);

  depth = 4;  // gauges are read when rendered
  families = ParsePrometheusText(registry.Render());
  ASSERT_TRUE(families.ok());
  EXPECT_EQ(*SampleValue(*families, "ckv_depth", "ckv_depth"), 4);
}

TEST(MetricsTest, FormatsValuesAsPrometheusDoes) {
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(1e-7), "1e-07");
  EXPECT_EQ(FormatMetricValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatMetricValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatMetricValue(NAN), "NaN");
}

// The parser is the test's yardstick, so it must fail on each kind of malformed text.
TEST(MetricsTest, ParserRejectsMalformedExpositions) {
  const std::string ok =
      "# HELP a_total A\n# TYPE a_total counter\na_total{x=\"1\"} 2\n"
      "# HELP h H\n# TYPE h histogram\n"
      "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n";
  ASSERT_TRUE(ParsePrometheusText(ok).ok()) << ParsePrometheusText(ok).status();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"no final newline", "# TYPE a gauge\na 1"},
      {"no TYPE", "a 1\n"},
      {"bad metric name", "# TYPE 1a gauge\n1a 1\n"},
      {"bad label name", "# TYPE a gauge\na{1x=\"v\"} 1\n"},
      {"unquoted label", "# TYPE a gauge\na{x=v} 1\n"},
      {"bad escape", "# TYPE a gauge\na{x=\"\\t\"} 1\n"},
      {"bad value", "# TYPE a gauge\na 1.2.3\n"},
      {"negative counter", "# TYPE a_total counter\na_total -1\n"},
      {"duplicate series", "# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n"},
      {"sample of another family", "# TYPE a gauge\nb 1\n"},
      {"TYPE after samples", "# TYPE a gauge\na 1\n# TYPE a gauge\n"},
      {"family split", "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\n# HELP a A\n"},
      {"bad type", "# TYPE a meter\na 1\n"},
      {"timestamp", "# TYPE a gauge\na 1 1700000000\n"},
      {"histogram not cumulative",
       "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"histogram le not increasing",
       "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n"
       "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"histogram without +Inf", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
      {"+Inf bucket != count",
       "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n"},
      {"histogram without _sum", "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n"},
  };
  for (const auto& [what, text] : bad) {
    EXPECT_FALSE(ParsePrometheusText(text).ok()) << what << ":\n" << text;
  }
}

}  // namespace
}  // namespace centroidkv::service::testing
