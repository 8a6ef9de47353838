#include "tests/kernels/reference_agreement.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace centroidkv::test {
namespace {

constexpr int kMaxExplained = 5;

// The rows of every head just before one pass: keys (as float64) and, for each input entry,
// the row that represents it.
struct State {
  std::vector<int64_t> lengths;                  // [H]
  std::vector<std::vector<double>> keys;         // [H][length * key_dim]
  std::vector<std::vector<int32_t>> assignment;  // [H][n]
};

State InputState(const LayerView& layer) {
  State state;
  const int32_t n = layer.num_tokens, dk = layer.key_dim;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    state.lengths.push_back(n);
    std::vector<double> keys(static_cast<size_t>(n) * dk);
    for (int32_t t = 0; t < n; ++t) {
      for (int32_t j = 0; j < dk; ++j) {
        keys[static_cast<size_t>(t) * dk + j] =
            LoadAsFloat(layer.keys, layer.dtype, layer.KeyOffset(h, t) + j);
      }
    }
    state.keys.push_back(std::move(keys));
    std::vector<int32_t> identity(static_cast<size_t>(n));
    for (int32_t t = 0; t < n; ++t) identity[t] = t;
    state.assignment.push_back(std::move(identity));
  }
  return state;
}

State ResultState(const CompressResult& result) {
  State state;
  const int32_t n = result.num_tokens, dk = result.key_dim;
  for (int32_t h = 0; h < result.num_heads; ++h) {
    const int64_t first = result.offsets[h], length = result.offsets[h + 1] - first;
    state.lengths.push_back(length);
    state.keys.emplace_back(result.keys.begin() + first * dk,
                            result.keys.begin() + (first + length) * dk);
    state.assignment.emplace_back(result.assignment.begin() + static_cast<int64_t>(h) * n,
                                  result.assignment.begin() + static_cast<int64_t>(h + 1) * n);
  }
  return state;
}

// The reference engine's cosine.
double Cosine(const std::vector<double>& keys, int64_t a, int64_t b, int32_t dim) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    const double x = keys[a * dim + j], y = keys[b * dim + j];
    dot += x * y;
    norm_a += x * x;
    norm_b += y * y;
  }
  return dot / (std::max(std::sqrt(norm_a), 1e-6) * std::max(std::sqrt(norm_b), 1e-6));
}

bool SameDecisions(const CompressResult& x, const CompressResult& y) {
  return x.offsets == y.offsets && x.counts == y.counts && x.assignment == y.assignment;
}

// For each row of the state of one head, the row it was merged into in the pass that turned
// `before` (row of each input) into `after` (its new row), or itself. In a merged group the
// destination is its only member at an odd offset of its chunk.
std::vector<int64_t> MergedInto(const std::vector<int32_t>& before,
                                const std::vector<int32_t>& after, int64_t length,
                                const CompressOptions& options) {
  std::vector<int64_t> new_row(static_cast<size_t>(length), -1);
  for (size_t i = 0; i < before.size(); ++i) new_row[before[i]] = after[i];
  auto is_destination = [&](int64_t row) {
    const int64_t offset = row - options.sink_tokens;
    return offset >= 0 && offset % options.chunk_size % 2 == 1;
  };
  std::vector<int64_t> destination_of(static_cast<size_t>(length), -1);  // by new row
  for (int64_t row = 0; row < length; ++row) {
    if (is_destination(row)) destination_of[new_row[row]] = row;
  }
  std::vector<int64_t> merged_into(static_cast<size_t>(length));
  for (int64_t row = 0; row < length; ++row) {
    const int64_t destination = destination_of[new_row[row]];
    merged_into[row] = destination >= 0 ? destination : row;
  }
  return merged_into;
}

// Explains the differing rows of one pass (see the header), appending to `agreement`.
class PassAnalysis {
 public:
  PassAnalysis(const State& state, const CompressOptions& options, int32_t pass, int64_t target,
               const std::vector<bool>& passthrough, int32_t key_dim)
      : state_(state),
        options_(options),
        floor_(options.min_similarity.has_value()
                   ? *options.min_similarity + pass * options.tighten_per_pass
                   : -std::numeric_limits<double>::infinity()),
        target_(target),
        passthrough_(passthrough),
        key_dim_(key_dim),
        tolerance_(NearTieTolerance(key_dim)) {}

  // The chunk [first, end) of `row` in a head of `length` rows; false outside any chunk.
  bool ChunkOf(int64_t length, int64_t row, int64_t* first, int64_t* end) const {
    const int64_t begin = options_.sink_tokens, range_end = length - options_.recent_tokens;
    if (range_end - begin < 2 || row < begin || row >= range_end) return false;
    *first = begin + (row - begin) / options_.chunk_size * options_.chunk_size;
    *end = std::min<int64_t>(*first + options_.chunk_size, range_end);
    return true;
  }

  // The best score of source `a` (over its chunk's destinations), or NaN if it has none.
  double BestScore(int32_t head, int64_t a) const {
    int64_t first, end;
    if (!ChunkOf(state_.lengths[head], a, &first, &end)) return std::nan("");
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t b = first + 1; b < end; b += 2) best = std::max(best, Score(head, a, b));
    return best;
  }

  double Score(int32_t head, int64_t a, int64_t b) const {
    return Cosine(state_.keys[head], a, b, key_dim_);
  }

  // Whether any best edge of a head taking part is within the tolerance of the floor.
  bool AnyFloorTie() const {
    if (std::isinf(floor_)) return false;
    for (size_t h = 0; h < state_.lengths.size(); ++h) {
      if (passthrough_[h] || state_.lengths[h] <= target_) continue;
      for (int64_t a = options_.sink_tokens; a < state_.lengths[h]; ++a) {
        int64_t first, end;
        if (!ChunkOf(state_.lengths[h], a, &first, &end) || (a - first) % 2 != 0) continue;
        const double best = BestScore(static_cast<int32_t>(h), a);
        if (!std::isnan(best) && std::fabs(best - floor_) <= tolerance_) return true;
      }
    }
    return false;
  }

  // The lowest score among the edges the reference merged in a head (its top-r boundary).
  double LastKeptScore(int32_t head, const std::vector<int64_t>& merged_into) const {
    double lowest = std::numeric_limits<double>::infinity();
    for (int64_t row = 0; row < state_.lengths[head]; ++row) {
      if (merged_into[row] != row) lowest = std::min(lowest, Score(head, row, merged_into[row]));
    }
    return lowest;
  }

  // One differing row; returns an explanation, or "" when it is not a near tie.
  std::string Explain(int32_t head, int64_t row, int64_t by_reference, int64_t by_engine,
                      double boundary) const {
    const double best = BestScore(head, row);
    if (std::isnan(best)) return "";
    if (by_reference != row && by_engine != row) {
      const double s1 = Score(head, row, by_reference), s2 = Score(head, row, by_engine);
      if (best - s1 <= tolerance_ && best - s2 <= tolerance_) {
        return absl::StrCat("argmax tie: row ", row, " -> ", by_reference, " or -> ", by_engine,
                            ", scores differ by ", s1 - s2);
      }
      return "";
    }
    if (!std::isinf(floor_) && std::fabs(best - floor_) <= tolerance_) {
      return absl::StrCat("floor tie: row ", row, " scores floor + ", best - floor_);
    }
    if (std::fabs(best - boundary) <= tolerance_) {
      return absl::StrCat("top-r tie: row ", row, " scores the last kept edge + ", best - boundary);
    }
    return "";
  }

  double tolerance() const { return tolerance_; }

 private:
  const State& state_;
  const CompressOptions& options_;
  double floor_;
  int64_t target_;
  const std::vector<bool>& passthrough_;
  int32_t key_dim_;
  double tolerance_;
};

void ExplainPass(const LayerView& layer, const CompressOptions& options, int32_t pass,
                 const State& before, const CompressResult& reference_after,
                 const CompressResult& engine_after, Agreement* agreement) {
  std::vector<bool> passthrough(static_cast<size_t>(layer.num_heads), false);
  for (int32_t h : options.passthrough_heads) passthrough[h] = true;
  const int64_t target =
      options.target_tokens.has_value()
          ? std::min<int64_t>(*options.target_tokens, layer.num_tokens)
          : static_cast<int64_t>(
                std::ceil(options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio) *
                          layer.num_tokens));
  const PassAnalysis analysis(before, options, pass, target, passthrough, layer.key_dim);
  const int32_t n = layer.num_tokens;
  bool floor_tie_checked = false, floor_tie = false;
  int unexplained = 0;
  for (int32_t h = 0; h < layer.num_heads; ++h) {
    auto assignment_of = [&](const CompressResult& r) {
      return std::vector<int32_t>(r.assignment.begin() + static_cast<int64_t>(h) * n,
                                  r.assignment.begin() + static_cast<int64_t>(h + 1) * n);
    };
    const int64_t length = before.lengths[h];
    const std::vector<int64_t> by_reference =
        MergedInto(before.assignment[h], assignment_of(reference_after), length, options);
    const std::vector<int64_t> by_engine =
        MergedInto(before.assignment[h], assignment_of(engine_after), length, options);
    int64_t merges_reference = 0, merges_engine = 0;
    for (int64_t row = 0; row < length; ++row) {
      merges_reference += by_reference[row] != row;
      merges_engine += by_engine[row] != row;
    }
    if (merges_reference != merges_engine) {
      if (!floor_tie_checked) {
        floor_tie = analysis.AnyFloorTie();
        floor_tie_checked = true;
      }
      if (floor_tie) {
        ++agreement->near_ties;
        absl::StrAppend(&agreement->explanation, "head ", h, ": ", merges_engine,
                        " merges instead of ", merges_reference,
                        " (a floor tie changes the candidate counts)\n");
        continue;
      }
      ADD_FAILURE() << "pass " << pass << ", head " << h << ": the engine merged " << merges_engine
                    << " edges, the reference " << merges_reference
                    << ", and no edge of the layer is within " << analysis.tolerance()
                    << " of the floor";
      continue;
    }
    const double boundary = analysis.LastKeptScore(h, by_reference);
    for (int64_t row = 0; row < length; ++row) {
      if (by_reference[row] == by_engine[row]) continue;
      const std::string why = analysis.Explain(h, row, by_reference[row], by_engine[row], boundary);
      if (!why.empty()) {
        if (++agreement->near_ties <= kMaxExplained) {
          absl::StrAppend(&agreement->explanation, "head ", h, ": ", why, "\n");
        }
        continue;
      }
      if (++unexplained <= kMaxExplained) {
        ADD_FAILURE() << "pass " << pass << ", head " << h << ", row " << row << ": merged into "
                      << by_engine[row] << " by the engine but into " << by_reference[row]
                      << " by the reference (itself = not merged), and "
                      << "this is not a near tie of the reference's scores (tolerance "
                      << analysis.tolerance() << ")";
      }
    }
  }
}

}  // namespace

double NearTieTolerance(int32_t key_dim) {
  return 2.0 * std::ldexp(static_cast<double>(key_dim) + 8.0, -23) + 1e-6;
}

Agreement ExpectAgreesWithReference(const ClusterEngine& engine, const ClusterEngine& reference,
                                    const LayerView& layer, const CompressOptions& options,
                                    double rel_tolerance) {
  Agreement agreement;
  auto run = [&](const ClusterEngine& e, const CompressOptions& o) {
    absl::StatusOr<CompressResult> result = e.Compress(layer, o);
    EXPECT_TRUE(result.ok()) << e.name() << ": " << result.status();
    return result.ok() ? *std::move(result) : CompressResult{};
  };
  const CompressResult expected = run(reference, options);
  const CompressResult actual = run(engine, options);
  if (SameDecisions(expected, actual)) {
    ExpectResultsNear(expected, actual, rel_tolerance);
    EXPECT_EQ(actual.passes_run, expected.passes_run);
    return agreement;
  }
  // Trace the divergence to its first pass.
  CompressOptions traced = options;
  traced.compute_assignment = true;
  CompressResult agreed_reference;  // both after the passes that agree
  for (int32_t pass = 0; pass < options.max_passes; ++pass) {
    traced.max_passes = pass + 1;
    const CompressResult reference_after = run(reference, traced);
    const CompressResult engine_after = run(engine, traced);
    if (SameDecisions(reference_after, engine_after)) {
      ExpectResultsNear(reference_after, engine_after, rel_tolerance);
      agreed_reference = reference_after;
      continue;
    }
    agreement.divergent_pass = pass;
    const State before = pass == 0 ? InputState(layer) : ResultState(agreed_reference);
    ExplainPass(layer, options, pass, before, reference_after, engine_after, &agreement);
    break;
  }
  if (agreement.divergent_pass < 0) {
    ADD_FAILURE() << "the results differ but no pass does when rerun pass by pass";
    return agreement;
  }
  if (agreement.near_ties > 0) {
    const std::string summary =
        absl::StrCat(std::string(engine.name()), " diverges from the reference at pass ",
                     agreement.divergent_pass, " through ", agreement.near_ties,
                     " near-tie decision(s) (tolerance ", NearTieTolerance(layer.key_dim), "):\n",
                     agreement.explanation);
    std::cout << "[ near tie ] " << summary;
    ::testing::Test::RecordProperty("near_tie_divergence", summary);
  }
  return agreement;
}

}  // namespace centroidkv::test
