// Budgeted, scored and fitted jobs (kernels/budgeted_heads.h, kernels/fit/) on every backend:
// bit-identical to the reference on drawn random jobs (dtypes, layouts, ragged heads,
// passthrough heads, budgets, centroid shares, floors), the definition checked from the
// inputs alone (budgets kept, exact entries bit for bit and the best scored, tail centroids
// the count-weighted means of their entries, rows in order of their earliest entry), score
// top-k eviction at centroid_share 0 against an oracle written here, and the fit's account.
// The TEST_Ps run for every backend of engine_conformance_test.cc's INSTANTIATE lines.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "gtest/gtest.h"
#include "centroidkv/common/dtype.h"
#include "tests/kernels/engine_conformance.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::conformance {
namespace {

using test::RandomLayer;
using test::RandomLayerSpec;

// A random layer with scores (coarse ones make ties), optionally ragged, with queries.
struct ScoredJob {
  std::string name;
  RandomLayer layer;
  std::vector<float> scores;
  std::vector<int64_t> offsets;  // ragged: [H + 1]
  std::vector<float> queries;
  int32_t query_heads = 0, queries_per_head = 0;
  CompressOptions options;

  LayerView view() const {
    LayerView v = layer.view();
    if (!scores.empty()) v.scores = scores.data();
    if (!offsets.empty()) {
      v.head_offsets = offsets.data();
      int64_t longest = 0;
      for (size_t h = 0; h + 1 < offsets.size(); ++h) {
        longest = std::max(longest, offsets[h + 1] - offsets[h]);
      }
      v.num_tokens = static_cast<int32_t>(longest);
    }
    if (!queries.empty()) {
      v.queries = queries.data();
      v.num_query_heads = query_heads;
      v.num_queries = queries_per_head;
    }
    return v;
  }
};

double Uniform(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}
int32_t Between(std::mt19937_64& rng, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

// Queries near the layer's keys (so that attention is peaked, as in a model).
std::vector<float> QueriesFor(const RandomLayer& layer, int32_t query_heads, int32_t per_head,
                              std::mt19937_64& rng) {
  const RandomLayerSpec& spec = layer.spec();
  const int32_t group = query_heads / spec.num_heads;
  std::vector<float> q(static_cast<size_t>(query_heads) * per_head * spec.key_dim);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (int32_t qh = 0; qh < query_heads; ++qh) {
    const int32_t h = qh / group;
    for (int32_t i = 0; i < per_head; ++i) {
      const auto token = static_cast<int32_t>(rng() % static_cast<uint64_t>(spec.num_tokens));
      for (int32_t j = 0; j < spec.key_dim; ++j) {
        q[(static_cast<size_t>(qh) * per_head + i) * spec.key_dim + j] =
            2.0f * layer.Key(h, token, j) + noise(rng);
      }
    }
  }
  return q;
}

ScoredJob DrawScoredJob(std::mt19937_64& rng, int index, bool with_queries) {
  RandomLayerSpec spec = Spec(Between(rng, 1, 4), Between(rng, 24, 260), Between(rng, 4, 40),
                              Between(rng, 4, 40), 1000 + index);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  spec.dtype = dtypes[rng() % 3];
  spec.with_counts = rng() % 3 == 0;
  if (rng() % 2 == 0) {
    spec.prototypes = Between(rng, 2, 12);
    spec.noise = 0.1;
  }
  const bool ragged = rng() % 4 == 0;
  if (!ragged && rng() % 4 == 0) spec.layout = TensorLayout::kTokenMajor;
  ScoredJob job{"drawn " + std::to_string(index), RandomLayer::Generate(spec), {}, {}, {}, 0, 0,
                {}};
  const int32_t heads = spec.num_heads, n = spec.num_tokens;
  std::vector<int32_t> lengths(static_cast<size_t>(heads), n);
  if (ragged) {
    job.offsets.assign(1, 0);
    for (int32_t h = 0; h < heads; ++h) {
      lengths[h] = Between(rng, 2, n);
      job.offsets.push_back(job.offsets.back() + lengths[h]);
    }
  }
  const bool coarse = rng() % 3 == 0;  // ties
  job.scores.resize(static_cast<size_t>(heads) * n);
  for (float& s : job.scores) {
    s = coarse ? static_cast<float>(rng() % 4) : static_cast<float>(Uniform(rng) * 10 - 5);
  }
  CompressOptions& o = job.options;
  o.chunk_size = Between(rng, 2, 64);
  o.sink_tokens = Between(rng, 0, 6);
  o.recent_tokens = Between(rng, 0, 12);
  const double shares[] = {0.0, 0.1, 0.25, 0.5, 1.0};
  o.centroid_share = shares[rng() % 5];
  const int32_t clusters[] = {0, 3, 32};
  o.max_cluster_size = clusters[rng() % 3];
  if (rng() % 3 == 0) o.min_similarity = Uniform(rng) - 0.2;
  if (heads > 1 && rng() % 3 == 0) o.passthrough_heads = {static_cast<int32_t>(rng() % heads)};
  o.compute_assignment = rng() % 4 != 0;
  if (rng() % 2 == 0) {
    o.head_budgets.resize(static_cast<size_t>(heads));
    for (int32_t h = 0; h < heads; ++h) {
      const bool passthrough =
          std::find(o.passthrough_heads.begin(), o.passthrough_heads.end(), h) !=
          o.passthrough_heads.end();
      const int32_t least = std::min(lengths[h], o.sink_tokens + o.recent_tokens);
      o.head_budgets[h] = passthrough ? lengths[h] + Between(rng, 0, 3)
                                      : Between(rng, std::max(least, 1), lengths[h] + 2);
    }
  } else {
    const int32_t longest = *std::max_element(lengths.begin(), lengths.end());
    o.target_tokens = Between(rng, std::max(o.sink_tokens + o.recent_tokens, 1), longest);
  }
  const DType results[] = {DType::kFloat32, DType::kFloat16, DType::kFp8E4M3};
  o.result_dtype = results[rng() % 3];
  if (with_queries) {
    job.query_heads = heads * Between(rng, 1, 3);
    job.queries_per_head = Between(rng, 4, 24);
    job.queries = QueriesFor(job.layer, job.query_heads, job.queries_per_head, rng);
    o.fit.block_tokens = Between(rng, 16, 128);
    o.fit.fit_values = rng() % 4 != 0;
  }
  return job;
}

// The definition, checked from the inputs alone (float32 results with an assignment).
void ExpectScoredDefinition(const ScoredJob& job, const CompressResult& r) {
  const LayerView v = job.view();
  const CompressOptions& o = job.options;
  ASSERT_EQ(r.dtype, DType::kFloat32);
  ASSERT_EQ(r.head_budgets.size(), static_cast<size_t>(v.num_heads));
  ASSERT_EQ(r.head_exact_entries.size(), static_cast<size_t>(v.num_heads));
  EXPECT_TRUE(r.target_reached);
  int reported = 0;
  for (int32_t h = 0; h < v.num_heads; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    const int32_t n = v.HeadTokens(h);
    const int64_t first = r.offsets[h], rows = r.offsets[h + 1] - first;
    EXPECT_LE(rows, r.head_budgets[h]);
    const int32_t* assignment = r.assignment.data() +
                                (v.head_offsets != nullptr ? v.head_offsets[h]
                                                           : static_cast<int64_t>(h) * v.num_tokens);
    // Members of each row, and each row's earliest entry.
    std::vector<std::vector<int32_t>> members(static_cast<size_t>(rows));
    for (int32_t t = 0; t < n; ++t) {
      if (assignment[t] >= 0) {
        ASSERT_LT(assignment[t], rows);
        members[assignment[t]].push_back(t);
      }
    }
    for (int64_t row = 0; row + 1 < rows; ++row) {
      ASSERT_FALSE(members[row].empty());
      ASSERT_FALSE(members[row + 1].empty());
      EXPECT_LT(members[row].front(), members[row + 1].front()) << "rows out of order";
    }
    const bool passthrough = std::find(o.passthrough_heads.begin(), o.passthrough_heads.end(),
                                       h) != o.passthrough_heads.end();
    if (passthrough || rows == n) {
      EXPECT_EQ(r.head_exact_entries[h], n);
    }
    const int32_t sink = std::min(o.sink_tokens, n);
    const int32_t recent = std::min(o.recent_tokens, n - sink);
    for (int64_t row = 0; row < rows; ++row) {
      const auto& m = members[row];
      uint64_t count = 0;
      for (int32_t t : m) count += v.CountAt(h, t);
      EXPECT_EQ(r.counts[first + row], count) << "row " << row;
      for (int32_t t : m) {
        if (t < sink || t >= n - recent) {
          EXPECT_EQ(m.size(), 1u) << "protected entry " << t << " merged";
        }
      }
    }
    // Sinks, recent entries and the best scored of the rest are exact: untouched rows.
    std::vector<int32_t> middle(static_cast<size_t>(n - sink - recent));
    std::iota(middle.begin(), middle.end(), sink);
    std::stable_sort(middle.begin(), middle.end(), [&](int32_t a, int32_t b) {
      return v.scores[v.RowIndex(h, a)] > v.scores[v.RowIndex(h, b)];
    });
    std::vector<int32_t> exact;
    for (int32_t t = 0; t < sink; ++t) exact.push_back(t);
    for (int32_t t = n - recent; t < n; ++t) exact.push_back(t);
    const int32_t best = r.head_exact_entries[h] - sink - recent;
    if (rows < n) {
      ASSERT_GE(best, 0);
      for (int32_t k = 0; k < best; ++k) exact.push_back(middle[k]);
    }
    for (int32_t t : exact) {
      ASSERT_GE(assignment[t], 0) << "exact entry " << t << " dropped";
      ExpectUntouched(v, r, h, t, assignment[t], &reported);
    }
  }
}

class ScoredJobTest : public EngineConformanceTest {};

TEST_P(ScoredJobTest, DrawnJobsAreBitIdenticalToTheReference) {
  std::mt19937_64 rng(20261207);
  for (int i = 0; i < 60; ++i) {
    ScoredJob job = DrawScoredJob(rng, i, /*with_queries=*/false);
    if (i % 5 == 4) job.scores.clear();  // budgets without scores
    if (job.scores.empty() && job.options.head_budgets.empty()) {
      job.options.head_budgets.assign(static_cast<size_t>(job.layer.spec().num_heads),
                                      job.layer.spec().num_tokens);
    }
    SCOPED_TRACE(job.name + ": " + job.layer.spec().ToString() + " " + Describe(job.options) +
                 " share " + std::to_string(job.options.centroid_share) +
                 (job.offsets.empty() ? "" : " ragged"));
    CompressResult mine, reference;
    const absl::StatusOr<LayerPlan> plan = PlanLayer(job.view(), job.options, EngineLimits{});
    if (!plan.ok()) {  // an impossible budget: both refuse it alike
      EXPECT_EQ(engine_->Compress(job.view(), job.options).status(), plan.status());
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &mine));
    ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &reference, reference_));
    test::ExpectBitIdentical(reference, mine);
    EXPECT_EQ(mine.stop_reasons, reference.stop_reasons);
    EXPECT_EQ(mine.target_reached, reference.target_reached);
    if (job.options.result_dtype == DType::kFloat32 && job.options.compute_assignment &&
        !job.scores.empty() && job.offsets.empty()) {
      ExpectScoredDefinition(job, mine);
    }
  }
}

// centroid_share 0 is score top-k eviction: sinks, recent and the budget's rest of the best
// scored, rows in order, counts and rows as they came, the rest dropped (assignment -1).
TEST_P(ScoredJobTest, ZeroShareIsTopKEviction) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 20; ++i) {
    ScoredJob job = DrawScoredJob(rng, 100 + i, false);
    job.offsets.clear();
    job.options.centroid_share = 0.0;
    job.options.result_dtype = DType::kFloat32;
    job.options.compute_assignment = true;
    job.options.passthrough_heads.clear();
    job.options.head_budgets.clear();
    const RandomLayerSpec& spec = job.layer.spec();
    job.options.target_tokens =
        std::max<int64_t>(job.options.sink_tokens + job.options.recent_tokens, spec.num_tokens / 3);
    SCOPED_TRACE(job.name + ": " + spec.ToString() + " " + Describe(job.options));
    CompressResult r;
    ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &r));
    const LayerView v = job.view();
    const int32_t n = spec.num_tokens;
    const int64_t budget = std::min<int64_t>(*job.options.target_tokens, n);
    for (int32_t h = 0; h < spec.num_heads; ++h) {
      const int32_t sink = std::min(job.options.sink_tokens, n);
      const int32_t recent = std::min(job.options.recent_tokens, n - sink);
      std::vector<int32_t> middle(static_cast<size_t>(n - sink - recent));
      std::iota(middle.begin(), middle.end(), sink);
      std::stable_sort(middle.begin(), middle.end(), [&](int32_t a, int32_t b) {
        return v.scores[v.RowIndex(h, a)] > v.scores[v.RowIndex(h, b)];
      });
      std::vector<int32_t> kept;
      for (int32_t t = 0; t < sink; ++t) kept.push_back(t);
      const int64_t best = budget >= n ? n - sink - recent : budget - sink - recent;
      for (int64_t k = 0; k < best; ++k) kept.push_back(middle[k]);
      for (int32_t t = n - recent; t < n; ++t) kept.push_back(t);
      std::sort(kept.begin(), kept.end());
      ASSERT_EQ(r.offsets[h + 1] - r.offsets[h], static_cast<int64_t>(kept.size()));
      EXPECT_EQ(r.head_exact_entries[h], static_cast<int32_t>(kept.size()));
      int reported = 0;
      std::vector<int32_t> want(static_cast<size_t>(n), -1);
      for (size_t row = 0; row < kept.size(); ++row) {
        want[kept[row]] = static_cast<int32_t>(row);
        ExpectUntouched(v, r, h, kept[row], static_cast<int64_t>(row), &reported);
      }
      EXPECT_EQ(std::vector<int32_t>(r.assignment.begin() + static_cast<int64_t>(h) * n,
                                     r.assignment.begin() + static_cast<int64_t>(h + 1) * n),
                want);
    }
  }
}

// Attention on `queries` ([Hq, m, dk]) with `r`'s rows and log-weights (ln(count) when
// `log_weights` is empty) against the full cache, in float64: the mean over queries of the
// relative error of the attention mass and of the attention output.
struct AttentionError {
  double mass = 0.0, output = 0.0;
};
AttentionError ErrorsOn(const LayerView& v, const CompressResult& r,
                        const std::vector<float>& log_weights, const std::vector<float>& queries,
                        int32_t query_heads, int32_t per_head) {
  const int32_t dk = v.key_dim, dv = v.value_dim, group = query_heads / v.num_heads;
  const double scale = 1.0 / std::sqrt(double(dk));
  AttentionError total;
  int64_t count = 0;
  for (int32_t qh = 0; qh < query_heads; ++qh) {
    const int32_t h = qh / group;
    for (int32_t i = 0; i < per_head; ++i) {
      const float* q = queries.data() + (static_cast<size_t>(qh) * per_head + i) * dk;
      const auto dot = [&](const float* k) {
        double d = 0.0;
        for (int32_t j = 0; j < dk; ++j) d += double(q[j]) * k[j];
        return d * scale;
      };
      std::vector<float> key(static_cast<size_t>(dk)), value(static_cast<size_t>(dv));
      double top = -INFINITY;
      std::vector<double> logits(static_cast<size_t>(v.HeadTokens(h)));
      for (int32_t t = 0; t < v.HeadTokens(h); ++t) {
        LoadAsFloats(v.keys, v.dtype, v.KeyOffset(h, t), dk, key.data());
        logits[t] = dot(key.data()) + std::log(double(v.CountAt(h, t)));
        top = std::max(top, logits[t]);
      }
      double mass = 0.0;
      std::vector<double> out(static_cast<size_t>(dv), 0.0), approx(static_cast<size_t>(dv), 0.0);
      for (int32_t t = 0; t < v.HeadTokens(h); ++t) {
        const double w = std::exp(logits[t] - top);
        mass += w;
        LoadAsFloats(v.values, v.dtype, v.ValueOffset(h, t), dv, value.data());
        for (int32_t d = 0; d < dv; ++d) out[d] += w * value[d];
      }
      double approx_mass = 0.0;
      for (int64_t row = r.offsets[h]; row < r.offsets[h + 1]; ++row) {
        const double beta = log_weights.empty() ? std::log(double(r.counts[row]))
                                                : double(log_weights[row]);
        const double w = std::exp(dot(r.keys.data() + row * dk) + beta - top);
        approx_mass += w;
        for (int32_t d = 0; d < dv; ++d) approx[d] += w * r.values[row * dv + d];
      }
      double diff = 0.0, norm = 0.0;
      for (int32_t d = 0; d < dv; ++d) {
        const double o = out[d] / mass, a = approx[d] / approx_mass;
        diff += (o - a) * (o - a);
        norm += o * o;
      }
      total.mass += std::abs(approx_mass / mass - 1.0);
      total.output += std::sqrt(diff / std::max(norm, 1e-30));
      ++count;
    }
  }
  total.mass /= double(count);
  total.output /= double(count);
  return total;
}

// Fitted jobs: every backend fits the same rows (the selection is bit-identical) with
// log-weights within their bound, and the fit carries over to queries it has not seen. On
// clustered keys, where a centroid's ln(count) under-counts its cluster's attention mass
// (Jensen: n exp(q . mean) <= sum exp(q . k)), attention on fresh queries from the same
// distribution is closer to the full cache's with the fitted log-weights and values.
TEST_P(ScoredJobTest, FittedJobsCarryOverToFreshQueries) {
  std::mt19937_64 rng(4242);
  AttentionError fitted_total, plain_total;
  int jobs = 0;
  for (int i = 0; i < 8; ++i) {
    const bool scored = i % 2 == 0;  // scores with every tail entry in a centroid, or none
    RandomLayerSpec spec = Spec(2, 192, 16, 16, 500 + i);
    spec.prototypes = 12;
    spec.noise = 0.3;
    ScoredJob job{"clustered " + std::to_string(i), RandomLayer::Generate(spec), {}, {}, {}, 0, 0,
                  {}};
    if (scored) {
      job.scores.resize(static_cast<size_t>(spec.num_heads) * spec.num_tokens);
      for (float& x : job.scores) x = static_cast<float>(Uniform(rng));
    }
    job.options.target_tokens = 48;
    job.options.chunk_size = 32;
    job.options.sink_tokens = 2;
    job.options.recent_tokens = 4;
    job.options.centroid_share = 1.0;
    job.options.max_cluster_size = 0;
    job.options.fit.block_tokens = 256;  // the whole head one block: the mass is shared out
    job.query_heads = 4;
    job.queries_per_head = 64;
    job.queries = QueriesFor(job.layer, job.query_heads, job.queries_per_head, rng);
    const std::vector<float> fresh = QueriesFor(job.layer, job.query_heads, 64, rng);
    SCOPED_TRACE(job.name + ": " + job.layer.spec().ToString());
    CompressResult fitted, reference, plain;
    ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &fitted));
    ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &reference, reference_));
    EXPECT_EQ(fitted.offsets, reference.offsets);
    EXPECT_EQ(fitted.counts, reference.counts);
    EXPECT_EQ(fitted.assignment, reference.assignment);
    ASSERT_EQ(fitted.log_weights.size(), static_cast<size_t>(fitted.total_entries()));
    for (int64_t row = 0; row < fitted.total_entries(); ++row) {
      const double prior = std::log(double(fitted.counts[row]));
      EXPECT_LE(std::abs(fitted.log_weights[row] - prior),
                job.options.fit.log_weight_bound + 1e-4) << "row " << row;
    }
    ScoredJob unfitted = job;
    unfitted.queries.clear();
    ASSERT_NO_FATAL_FAILURE(Run(unfitted.view(), unfitted.options, &plain));
    const AttentionError a =
        ErrorsOn(job.view(), fitted, fitted.log_weights, fresh, job.query_heads, 64);
    const AttentionError b = ErrorsOn(job.view(), plain, {}, fresh, job.query_heads, 64);
    fitted_total.mass += a.mass;
    fitted_total.output += a.output;
    plain_total.mass += b.mass;
    plain_total.output += b.output;
    ++jobs;
  }
  EXPECT_LT(fitted_total.mass, 0.85 * plain_total.mass)
      << "mass error, fitted " << fitted_total.mass / jobs << " vs ln(count) "
      << plain_total.mass / jobs;
  EXPECT_LT(fitted_total.output, 0.8 * plain_total.output)
      << "output error, fitted " << fitted_total.output / jobs << " vs unfitted "
      << plain_total.output / jobs;
}

TEST_P(ScoredJobTest, TheFullCacheNeedsNoFit) {
  std::mt19937_64 rng(9);
  ScoredJob job = DrawScoredJob(rng, 300, /*with_queries=*/true);
  job.options.head_budgets.clear();
  job.options.target_tokens.reset();
  job.options.target_ratio = 1.0;
  job.options.result_dtype = DType::kFloat32;
  job.offsets.clear();
  CompressResult r;
  ASSERT_NO_FATAL_FAILURE(Run(job.view(), job.options, &r));
  ASSERT_EQ(r.log_weights.size(), r.counts.size());
  for (size_t row = 0; row < r.counts.size(); ++row) {
    EXPECT_EQ(r.log_weights[row], std::log(static_cast<float>(r.counts[row])));
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, ScoredJobTest,
                         ::testing::Values(Backend{BackendKind::kReference}));
INSTANTIATE_TEST_SUITE_P(Cpu, ScoredJobTest, ::testing::Values(Backend{BackendKind::kCpu}));
INSTANTIATE_TEST_SUITE_P(CpuAvx2, ScoredJobTest,
                         ::testing::Values(Backend{BackendKind::kCpu, false,
                                                   cpu::SimdLevel::kAvx2}));
INSTANTIATE_TEST_SUITE_P(Cuda, ScoredJobTest, ::testing::Values(Backend{BackendKind::kCuda}));
INSTANTIATE_TEST_SUITE_P(CudaStagesOnHost, ScoredJobTest,
                         ::testing::Values(Backend{BackendKind::kCuda, true}));

}  // namespace
}  // namespace centroidkv::conformance
