// centroidkv-fit-bench: the cost of fitting one KV head (kernels/fit/, docs/scored-jobs.md
// "Fitted jobs") on the cpu backend, against this CPU's fp32 FMA peak on one thread. For each
// context length T and reference-query count m: a head of T entries (clustered keys, dk = dv
// = --dim) compressed to --kept of it by a scored job, then its fit timed alone (one thread,
// the job's rows copied back before each run): ms per head, the fit's matrix arithmetic
// (HeadFitStats::flops: the products over the full cache, the rows and the Gram matrices,
// the Cholesky factors) in GFLOP/s, and its share of the one-thread peak. Medians of --runs.
// The last line is one JSON list of the rows.
//
//   centroidkv-fit-bench [--tokens 1024,4096,32768] [--queries 256,1024] [--dim 128]
//                        [--kept 0.25] [--runs 5] [--block-tokens 32]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "bench/cpu_peak.h"
#include "kernels/cpu/cpu_engine.h"
#include "kernels/fit/fit_stage.h"
#include "kernels/job_validation.h"

namespace centroidkv::bench {
namespace {

struct Row {
  int32_t tokens = 0, queries = 0;
  double ms = 0.0, gflops = 0.0, share = 0.0;
};

std::vector<int32_t> Ints(const std::string& text) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) out.push_back(std::stoi(std::string(part)));
  return out;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Run(int argc, char** argv) {
  CLI::App app{"centroidkv-fit-bench: one KV head's fit against the one-thread fp32 peak"};
  std::string tokens_list = "1024,4096,32768", queries_list = "256,1024";
  int32_t dim = 128, runs = 5, block_tokens = FitOptions::kDefaultBlockTokens;
  double kept = 0.25;
  bool weights_only = false;
  app.add_option("--tokens", tokens_list, "context lengths T");
  app.add_option("--queries", queries_list, "reference queries m of the head");
  app.add_option("--dim", dim, "key and value dim");
  app.add_option("--kept", kept, "share of the head kept (scored job, centroid share 0.2)");
  app.add_option("--runs", runs, "timed runs per shape (median)");
  app.add_option("--block-tokens", block_tokens, "FitOptions::block_tokens");
  app.add_flag("--weights-only", weights_only, "FitOptions::fit_values off");
  CLI11_PARSE(app, argc, argv);

  const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  PeakOptions peak_options;
  peak_options.threads = 1;
  const PeakResult peak = MeasureFp32Peak(peak_options);
  std::printf("fp32 peak, one thread (%s): %.1f GFLOP/s\n", peak.isa.c_str(), peak.gflops);
  const cpu::CpuEngine engine;
  std::printf("| T | m | ms per head | GFLOP/s | share of the one-thread peak | ms: masses / "
              "features / weights / values |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::vector<Row> rows;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t tokens : Ints(tokens_list)) {
    // Clustered keys (64 prototypes), as in a model's cache; scores at random.
    std::vector<float> keys(static_cast<size_t>(tokens) * dim), values(keys.size());
    std::vector<float> prototypes(static_cast<size_t>(64) * dim), scores(tokens);
    for (float& x : prototypes) x = normal(rng);
    for (int32_t t = 0; t < tokens; ++t) {
      const int32_t p = static_cast<int32_t>(rng() % 64);
      for (int32_t j = 0; j < dim; ++j) {
        keys[static_cast<size_t>(t) * dim + j] = prototypes[p * dim + j] + 0.3f * normal(rng);
        values[static_cast<size_t>(t) * dim + j] = normal(rng);
      }
      scores[t] = static_cast<float>(rng() % 100000);
    }
    for (int32_t m : Ints(queries_list)) {
      std::vector<float> queries(static_cast<size_t>(m) * dim);
      for (int32_t i = 0; i < m; ++i) {
        const auto t = static_cast<size_t>(rng() % static_cast<uint64_t>(tokens));
        for (int32_t j = 0; j < dim; ++j) {
          queries[static_cast<size_t>(i) * dim + j] = 2.0f * keys[t * dim + j] + 0.5f * normal(rng);
        }
      }
      LayerView layer{.num_heads = 1, .num_tokens = tokens, .key_dim = dim, .value_dim = dim,
                      .keys = keys.data(), .values = values.data(), .scores = scores.data(),
                      .queries = queries.data(), .num_query_heads = 1, .num_queries = m};
      CompressOptions options;
      options.target_ratio = kept;
      options.chunk_size = 256;
      options.sink_tokens = 4;
      options.recent_tokens = 0;
      options.max_cluster_size = 0;
      options.compute_assignment = true;
      options.fit.block_tokens = block_tokens;
      options.fit.fit_values = !weights_only;
      absl::StatusOr<LayerPlan> plan = PlanJob(layer, options, engine.limits(), true);
      LayerView unfitted_layer = layer;
      unfitted_layer.queries = nullptr;
      unfitted_layer.num_query_heads = unfitted_layer.num_queries = 0;
      absl::StatusOr<CompressResult> selected = engine.Compress(unfitted_layer, options);
      if (!plan.ok() || !selected.ok()) {
        std::fprintf(stderr, "T=%d m=%d: %s\n", tokens, m,
                     (!plan.ok() ? plan.status() : selected.status()).ToString().c_str());
        return 1;
      }
      std::vector<double> seconds, flops;
      fit::HeadFitStats phases;
      for (int32_t run = 0; run < runs; ++run) {
        CompressResult result = *selected;
        std::vector<fit::HeadFitStats> stats;
        const auto start = std::chrono::steady_clock::now();
        if (absl::Status fitted = FitResult(engine, *plan, layer, &result, &stats); !fitted.ok()) {
          std::fprintf(stderr, "fit: %s\n", fitted.ToString().c_str());
          return 1;
        }
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        flops.push_back(stats.front().flops);
        phases = stats.front();
      }
      Row row{tokens, m, 1000.0 * Median(seconds), 0.0, 0.0};
      row.gflops = Median(flops) / Median(seconds) / 1e9;
      row.share = row.gflops / peak.gflops;
      std::printf("| %d | %d | %.2f | %.1f | %.0f%% | %.1f / %.1f / %.1f / %.1f |\n", tokens, m,
                  row.ms, row.gflops, 100.0 * row.share, 1000 * phases.seconds_masses,
                  1000 * phases.seconds_features, 1000 * phases.seconds_weights,
                  1000 * phases.seconds_values);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  std::printf("[");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::printf("%s{\"tokens\": %d, \"queries\": %d, \"ms_per_head\": %.3f, \"gflops\": %.2f, "
                "\"peak_gflops\": %.2f, \"share_of_peak\": %.4f}",
                i == 0 ? "" : ", ", rows[i].tokens, rows[i].queries, rows[i].ms, rows[i].gflops,
                peak.gflops, rows[i].share);
  }
  std::printf("]\n");
  return 0;
}

}  // namespace
}  // namespace centroidkv::bench

int main(int argc, char** argv) { return centroidkv::bench::Run(argc, argv); }
