// Tests of kernels/cpu/soft_match.cc and the kernel tables behind it (kernels_scalar.cc,
// simd/kernels_avx2.cc, simd/kernels_avx512.cc, simd/kernels_amx.cc): every kernel of every SIMD level this CPU
// supports (the scalar fallback included) against plain scalar loops, on random shapes
// (head dims 1 to 256 with odd ones, chunks of 2 to 4096 rows), all three wire dtypes and
// float64 rows. Similarity scores must lie within MatchErrorBound of the exact (reference)
// cosine and, where matching and rescoring share their arithmetic, agree exactly; widening, packing, conversion and
// merging must be bit-exact.
#include "kernels/cpu/soft_match.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/edge_decisions.h"
#include "kernels/cpu/exact_cosine.h"
#include "kernels/cpu/fp8_elements.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/simd_dispatch.h"

namespace centroidkv::cpu {
namespace {

constexpr uint64_t kSeed = 20250611;

std::string ElemTypeName(ElemType type) {
  switch (type) {
    case ElemType::kF32:
      return "f32";
    case ElemType::kF16:
      return "f16";
    case ElemType::kBF16:
      return "bf16";
    case ElemType::kF64:
      return "f64";
    case ElemType::kE4M3:
      return "e4m3";
    case ElemType::kE5M2:
      return "e5m2";
  }
  return "?";
}

// `rows` rows of `dim` elements stored as `type`, `stride` elements apart; fp8 codes stand
// for their value times kFp8Scale (not a power of two: widening rounds).
class Rows {
 public:
  static constexpr float kFp8Scale = 0.0371f;

  Rows(ElemType type, int32_t rows, int32_t dim, int32_t padding = 0)
      : type_(type), rows_(rows), dim_(dim), stride_(dim + padding) {
    bytes_.assign(static_cast<size_t>(rows) * stride_ * ElemBytes(), 0);
    block_ = RowBlock{bytes_.data(), type_, stride_, IsFp8Elem(type) ? kFp8Scale : 1.0f};
  }

  int64_t ElemBytes() const { return ElemTypeBytes(type_); }

  // Stores `x` rounded to the element type.
  void Set(int32_t r, int32_t j, double x) {
    const int64_t index = static_cast<int64_t>(r) * stride_ + j;
    switch (type_) {
      case ElemType::kF32:
        reinterpret_cast<float*>(bytes_.data())[index] = static_cast<float>(x);
        return;
      case ElemType::kF16:
        reinterpret_cast<uint16_t*>(bytes_.data())[index] = FloatToHalf(static_cast<float>(x));
        return;
      case ElemType::kBF16:
        reinterpret_cast<uint16_t*>(bytes_.data())[index] = FloatToBFloat16(static_cast<float>(x));
        return;
      case ElemType::kF64:
        reinterpret_cast<double*>(bytes_.data())[index] = x;
        return;
      case ElemType::kE4M3:
      case ElemType::kE5M2:
        bytes_[index] = FloatToFp8(static_cast<float>(x) / kFp8Scale, Fp8DTypeOf(type_));
        return;
    }
  }

  // The stored element, widened exactly.
  double At(int32_t r, int32_t j) const {
    const int64_t index = static_cast<int64_t>(r) * stride_ + j;
    switch (type_) {
      case ElemType::kF32:
        return reinterpret_cast<const float*>(bytes_.data())[index];
      case ElemType::kF16:
        return HalfToFloat(reinterpret_cast<const uint16_t*>(bytes_.data())[index]);
      case ElemType::kBF16:
        return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(bytes_.data())[index]);
      case ElemType::kF64:
        return reinterpret_cast<const double*>(bytes_.data())[index];
      case ElemType::kE4M3:
      case ElemType::kE5M2:
        return Fp8ToFloat(bytes_[index], Fp8DTypeOf(type_)) * kFp8Scale;
    }
    return 0.0;
  }

  const RowBlock& Block() const { return block_; }
  int32_t rows() const { return rows_; }
  int32_t dim() const { return dim_; }
  ElemType type() const { return type_; }

 private:
  ElemType type_;
  int32_t rows_, dim_;
  int64_t stride_;
  std::vector<uint8_t> bytes_;
  RowBlock block_;
};

// How rows are drawn: independent normals, a few prototypes plus small noise (near ties),
// or exact duplicates of a few rows (exact ties), at a scale.
enum class Shape { kIndependent, kNearDuplicates, kDuplicates };

Rows RandomRows(ElemType type, int32_t count, int32_t dim, Shape shape, double scale,
                std::mt19937_64& rng, int32_t padding = 0) {
  std::normal_distribution<double> normal;
  Rows rows(type, count, dim, padding);
  std::vector<std::vector<double>> prototypes(3, std::vector<double>(dim));
  for (auto& p : prototypes) {
    for (double& x : p) x = normal(rng);
  }
  for (int32_t r = 0; r < count; ++r) {
    const auto& p = prototypes[rng() % prototypes.size()];
    for (int32_t j = 0; j < dim; ++j) {
      double x = normal(rng);
      if (shape == Shape::kNearDuplicates) x = p[j] + 1e-4 * x;
      if (shape == Shape::kDuplicates) x = p[j];
      rows.Set(r, j, scale * x);
    }
  }
  return rows;
}

// The reference engine's cosine, written out again here.
double ReferenceCosine(const Rows& rows, int32_t a, int32_t b) {
  double dot = 0.0, norm_a = 0.0, norm_b = 0.0;
  for (int32_t j = 0; j < rows.dim(); ++j) {
    const double x = rows.At(a, j), y = rows.At(b, j);
    dot += x * y;
    norm_a += x * x;
    norm_b += y * y;
  }
  return dot / (std::max(std::sqrt(norm_a), 1e-6) * std::max(std::sqrt(norm_b), 1e-6));
}

class SoftMatchTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  const KernelTable& kernels() const { return KernelsFor(GetParam()); }
};

struct MatchCase {
  ElemType type;
  int32_t dim;
  int32_t chunk;
  Shape shape;
  double scale = 1.0;
};

// Matches one chunk and checks every source against the exact cosines. Raises *worst to the
// largest |float score - exact score| seen, as a fraction of the bound.
// Counts the sources that were near ties, and those whose near-tie list was kept.
void CheckChunk(const KernelTable& kernels, const MatchCase& c, std::mt19937_64& rng,
                double* worst, int* near_tie_sources, int* listed_sources) {
  const Rows rows = RandomRows(c.type, c.chunk, c.dim, c.shape, c.scale, rng, c.dim % 3);
  ChunkMatcher matcher;
  std::vector<RowMatch> matches(static_cast<size_t>(c.chunk + 1) / 2);
  matcher.Match(kernels, rows.Block(), 0, c.chunk, c.dim, matches.data());
  // Match() scores within the kernels' bound (wider on a matrix engine); Rescore() scores are
  // match_rows' arithmetic on every level, so within the float bound.
  const double bound = MatchErrorBound(kernels, c.dim);
  const double rescore_bound = MatchErrorBound(c.dim);
  ASSERT_LE(rescore_bound, bound);
  const bool same_arithmetic = !UsesQuantisedMatch(kernels, c.chunk);
  const int32_t destinations = c.chunk / 2;
  EXPECT_EQ(matcher.sources(), (c.chunk + 1) / 2);
  EXPECT_EQ(matcher.destinations(), destinations);
  int reported = 0;
  auto check_error = [&](const char* what, int32_t i, int32_t k, double score, double exact_score,
                         double limit) {
    const double error = std::fabs(score - exact_score);
    *worst = std::max(*worst, error / limit);
    if (error > limit && ++reported <= 5) {
      ADD_FAILURE() << what << ": source " << i << ", destination " << k << ": float " << score
                    << ", exact " << exact_score << ", error " << error << " > bound " << limit;
    }
  };
  for (int32_t i = 0; i < matcher.sources(); ++i) {
    std::vector<double> exact(static_cast<size_t>(destinations));
    for (int32_t k = 0; k < destinations; ++k) {
      exact[k] = ReferenceCosine(rows, 2 * i, 2 * k + 1);
      ASSERT_EQ(exact[k], ExactCosine(rows.Block(), 2 * i, 2 * k + 1, c.dim))
          << "ExactCosine must be the reference's cosine bit for bit";
    }
    const RowMatch& match = matches[i];
    ASSERT_GE(match.best, 0);
    ASSERT_LT(match.best, destinations);
    // The best and its score, and the second: each the float score of a destination, so
    // within the bound of that destination's exact score, and the top two of all of them.
    check_error("match", i, match.best, match.first, exact[match.best], bound);
    double exact_top = -std::numeric_limits<double>::infinity();
    double exact_second = -std::numeric_limits<double>::infinity();
    for (int32_t k = 0; k < destinations; ++k) {
      exact_top = std::max(exact_top, exact[k]);
      if (k != match.best) exact_second = std::max(exact_second, exact[k]);
    }
    EXPECT_GE(match.first + bound, exact_top) << "source " << i;
    if (destinations >= 2) {
      EXPECT_LE(std::fabs(match.second - exact_second), bound) << "source " << i;
    } else {
      EXPECT_EQ(match.second, -std::numeric_limits<float>::infinity());
    }
    EXPECT_GE(match.first, match.second) << "source " << i;

    const std::span<const float> scores = matcher.Rescore(i);
    ASSERT_EQ(scores.size(), static_cast<size_t>(destinations));
    for (int32_t k = 0; k < destinations; ++k) {
      check_error("rescore", i, k, scores[k], exact[k], rescore_bound);
    }
    if (same_arithmetic) {
      // The match and the rescore are the same arithmetic: the same top two, and the best is
      // a destination with the top score (scaling by the inverse norm may round two unequal
      // dot products to one score, so not necessarily the lowest such destination).
      const float top = *std::max_element(scores.begin(), scores.end());
      EXPECT_EQ(scores[match.best], top) << "source " << i;
      EXPECT_EQ(match.first, top) << "source " << i;
      float second = -std::numeric_limits<float>::infinity();
      for (int32_t k = 0; k < destinations; ++k) {
        if (k != match.best) second = std::max(second, scores[k]);
      }
      EXPECT_EQ(match.second, second) << "source " << i;
    }
    // And the float best is the exact best unless the two are within twice the bound.
    EXPECT_GE(exact[match.best], exact_top - 2 * bound) << "source " << i;
    // A quantised path (matrix engine, int16) lists the near ties: every exact best is among them.
    if (const NearTies* ties = matcher.near_ties(i); ties != nullptr) {
      const bool near_tie = destinations >= 2 && static_cast<double>(match.second) >=
                                                     static_cast<double>(match.first) - 2 * bound;
      if (!near_tie) continue;
      ++*near_tie_sources;
      ASSERT_GE(ties->count, 2) << "source " << i;
      if (ties->count > NearTies::kMax) continue;  // overflow: the engine rescans the row
      ++*listed_sources;
      for (int32_t t = 0; t < ties->count; ++t) {
        ASSERT_GE(ties->destinations[t], 0);
        ASSERT_LT(ties->destinations[t], destinations);
        if (t > 0) {
          ASSERT_LT(ties->destinations[t - 1], ties->destinations[t]);
        }
      }
      const int32_t* listed_end = ties->destinations + ties->count;
      for (int32_t k = 0; k < destinations; ++k) {
        if (exact[k] != exact_top && k != match.best) continue;
        EXPECT_NE(std::find(ties->destinations, listed_end, k), listed_end)
            << "source " << i << ": destination " << k << " (an exact best or the float best) "
            << "is missing from the near-tie list";
      }
    }
  }
}

// Where a level lists near ties (AMX, the AVX2 and AVX-512 VNNI int16 paths): a source with
// exact copies among the destinations gets exactly those copies listed, in increasing order,
// whether the copies sit in different lanes of the kernel's panels (the int16 path reads
// them off each lane's best) or share a lane (it rescans the row), and an overflowing list
// says so, also when the copies are the bests of more than NearTies::kMax lanes.
TEST_P(SoftMatchTest, NearTieListsHoldEveryCopyOfTheSource) {
  constexpr int32_t kDim = 96, kChunk = 400;  // 200 destinations: 25 panels of 8 or 13 of 16
  struct Case {
    std::vector<int32_t> copies;  // destinations equal to source 0
  };
  const std::vector<Case> cases = {
      {{3, 5}},                         // two lanes
      {{0, 8, 13}},                     // lanes 0 and 5, two in lane 0
      {{1, 9, 17, 25, 190}},            // four in lane 1
      {{2, 4, 6, 10, 12, 14, 30, 50, 70}},  // nine: more than NearTies::kMax
      {{17, 18, 19, 20, 21, 22, 23, 24, 25}},  // nine lanes of 16 (two share a lane of 8)
  };
  std::mt19937_64 rng(kSeed + 7);
  for (const Case& c : cases) {
    SCOPED_TRACE("copies " + std::to_string(c.copies.size()) + ", first " +
                 std::to_string(c.copies.front()));
    Rows rows = RandomRows(ElemType::kF32, kChunk, kDim, Shape::kIndependent, 1.0, rng);
    for (int32_t k : c.copies) {
      for (int32_t j = 0; j < kDim; ++j) rows.Set(2 * k + 1, j, rows.At(0, j));
    }
    ChunkMatcher matcher;
    std::vector<RowMatch> matches(kChunk / 2);
    matcher.Match(kernels(), rows.Block(), 0, kChunk, kDim, matches.data());
    const NearTies* ties = matcher.near_ties(0);
    if (ties == nullptr) GTEST_SKIP() << kernels().name << " keeps no near-tie lists";
    EXPECT_EQ(matches[0].best, c.copies.front());
    if (static_cast<int32_t>(c.copies.size()) > NearTies::kMax) {
      EXPECT_EQ(ties->count, NearTies::kMax + 1);
      continue;
    }
    ASSERT_EQ(ties->count, static_cast<int32_t>(c.copies.size()));
    EXPECT_EQ(std::vector<int32_t>(ties->destinations, ties->destinations + ties->count),
              c.copies);
  }
}

// The fixed and the drawn cases of ScoresAreWithinTheBoundOfTheExactCosine, on `kernels`.
void CheckScoresAgainstExactCosines(const KernelTable& kernels) {
  std::mt19937_64 rng(kSeed);
  const std::vector<MatchCase> cases = {
      {ElemType::kF16, 128, 256, Shape::kIndependent},
      {ElemType::kF16, 128, 64, Shape::kNearDuplicates},
      {ElemType::kBF16, 64, 100, Shape::kIndependent},
      {ElemType::kF32, 9, 33, Shape::kIndependent},
      {ElemType::kF32, 33, 47, Shape::kNearDuplicates},
      {ElemType::kF32, 127, 130, Shape::kDuplicates},
      {ElemType::kF64, 16, 77, Shape::kNearDuplicates},
      {ElemType::kF64, 256, 65, Shape::kIndependent},
      {ElemType::kF16, 8, 4096, Shape::kIndependent},
      {ElemType::kF32, 16, 256, Shape::kNearDuplicates},  // long enough for a matrix engine
      {ElemType::kF16, 64, 200, Shape::kDuplicates},
      {ElemType::kBF16, 1, 9, Shape::kIndependent},
      {ElemType::kF32, 2, 2, Shape::kIndependent},
      {ElemType::kF32, 3, 3, Shape::kDuplicates},
      {ElemType::kF32, 17, 20, Shape::kIndependent, 1e-9},  // norms clamp at 1e-6
      {ElemType::kF32, 40, 18, Shape::kIndependent, 1e20},  // float sums of squares overflow
      {ElemType::kBF16, 24, 12, Shape::kNearDuplicates, 1e30},
      {ElemType::kE4M3, 64, 72, Shape::kNearDuplicates},
      {ElemType::kE5M2, 33, 40, Shape::kIndependent},
  };
  double worst = 0.0;
  int near_ties = 0, listed = 0;
  for (const MatchCase& c : cases) {
    SCOPED_TRACE(ElemTypeName(c.type) + " dim " + std::to_string(c.dim) + " chunk " +
                 std::to_string(c.chunk) + " seed " + std::to_string(kSeed));
    ASSERT_NO_FATAL_FAILURE(CheckChunk(kernels, c, rng, &worst, &near_ties, &listed));
  }
  // Random shapes.
  for (int n = 0; n < 12; ++n) {
    MatchCase c{static_cast<ElemType>(rng() % 4), static_cast<int32_t>(1 + rng() % 256),
                static_cast<int32_t>(2 + rng() % 300), static_cast<Shape>(rng() % 3)};
    SCOPED_TRACE("drawn: " + ElemTypeName(c.type) + " dim " + std::to_string(c.dim) + " chunk " +
                 std::to_string(c.chunk) + " seed " + std::to_string(kSeed));
    ASSERT_NO_FATAL_FAILURE(CheckChunk(kernels, c, rng, &worst, &near_ties, &listed));
  }
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(worst));
  EXPECT_LE(worst, 1.0);
  if (kernels.match_bf16x3 != nullptr || kernels.match_int16 != nullptr) {
    // Both ways of resolving a near tie were taken: the list and the rescan.
    EXPECT_GT(listed, 0);
    EXPECT_GT(near_ties, listed);
  }
}

TEST_P(SoftMatchTest, ScoresAreWithinTheBoundOfTheExactCosine) {
  CheckScoresAgainstExactCosines(kernels());
}

// A level's int16 matching below its int16_min_chunk too (CpuEngineOptions::int16_every_chunk
// does this for the engine): the short chunks of the cases above, in integers.
TEST_P(SoftMatchTest, Int16AtEveryChunkLengthIsWithinTheBound) {
  if (kernels().match_int16 == nullptr) GTEST_SKIP() << kernels().name << " has no int16 matching";
  KernelTable forced = kernels();
  forced.int16_min_chunk = 2;
  CheckScoresAgainstExactCosines(forced);
}

// A layer job's bound covers every chunk it matches: the quantised path's bound where chunks
// of that length take it, the float bound where every chunk up to that length is matched in
// float (int16 levels below int16_min_chunk), and never decreasing with the chunk length.
TEST_P(SoftMatchTest, JobBoundCoversEveryChunkLength) {
  for (int32_t dim : {1, 64, 128, 256}) {
    double previous = 0.0;
    for (int32_t chunk : {2, 3, 63, 64, 95, 96, 97, 128, 191, 192, 256, 1024, 4096}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " chunk " + std::to_string(chunk));
      const double bound = MatchErrorBound(kernels(), dim, chunk);
      EXPECT_GE(bound, previous);
      previous = bound;
      for (int32_t length = 2; length <= chunk; length = length < 64 ? length + 1 : length * 2) {
        EXPECT_GE(bound, UsesQuantisedMatch(kernels(), length) ? MatchErrorBound(kernels(), dim)
                                                               : MatchErrorBound(dim));
      }
      if (kernels().match_bf16x3 == nullptr && !UsesQuantisedMatch(kernels(), chunk)) {
        EXPECT_EQ(bound, MatchErrorBound(dim));
      }
    }
  }
}

// The engine's exact scorer (rows widened by the level's kernels, pairs scored together in
// groups of 4, 2 and 1, batches of 8) gives the reference's cosine bit for bit, for every
// batch size and dtype.
TEST_P(SoftMatchTest, ExactScorerIsTheReferenceCosineInEveryBatch) {
  std::mt19937_64 rng(kSeed + 7);
  for (ElemType type : {ElemType::kF16, ElemType::kBF16, ElemType::kF32, ElemType::kF64,
                        ElemType::kE4M3, ElemType::kE5M2}) {
    for (int32_t dim : {1, 7, 128, 129}) {
      SCOPED_TRACE(ElemTypeName(type) + " dim " + std::to_string(dim));
      const Rows rows = RandomRows(type, 24, dim, Shape::kNearDuplicates, 3.0, rng, 1);
      const ExactScorer scorer(kernels(), rows.Block(), dim);
      for (size_t count = 1; count <= 19; ++count) {
        std::vector<int64_t> others;
        for (size_t k = 0; k < count; ++k) others.push_back(static_cast<int64_t>(1 + k));
        std::vector<double> scores(count, -2.0);
        scorer.Scores(0, others, scores.data());
        for (size_t k = 0; k < count; ++k) {
          ASSERT_EQ(scores[k], ReferenceCosine(rows, 0, static_cast<int32_t>(others[k])))
              << "batch of " << count << ", pair " << k;
        }
      }
      EXPECT_EQ(scorer(5, 6), ReferenceCosine(rows, 5, 6));
    }
  }
}

// Long rows at the largest head dim: the bound still holds where it is tightest relative to
// the arithmetic (near-parallel rows, so scores near 1).
TEST_P(SoftMatchTest, BoundHoldsForLongNearParallelRows) {
  std::mt19937_64 rng(kSeed + 1);
  for (int32_t dim : {1024, 4096}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    double worst = 0.0;
    int near_ties = 0, listed = 0;
    ASSERT_NO_FATAL_FAILURE(CheckChunk(kernels(), {ElemType::kF32, dim, 6, Shape::kNearDuplicates},
                                       rng, &worst, &near_ties, &listed));
    EXPECT_LE(worst, 1.0);
  }
}

TEST_P(SoftMatchTest, WidenRowsIsExactAndGivesInverseNorms) {
  std::mt19937_64 rng(kSeed + 2);
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kF64,
                        ElemType::kE4M3, ElemType::kE5M2}) {
    for (int32_t dim : {1, 7, 16, 33, 128, 255}) {
      SCOPED_TRACE(ElemTypeName(type) + " dim " + std::to_string(dim));
      const Rows rows = RandomRows(type, 5, dim, Shape::kIndependent, 1.0, rng, 3);
      std::vector<float> out(static_cast<size_t>(4) * dim), inverse(4);
      EXPECT_TRUE(kernels().widen_rows(&rows.Block(), 1, 4, dim, out.data(), inverse.data()));
      for (int32_t i = 0; i < 4; ++i) {
        double sum = 0.0;
        for (int32_t j = 0; j < dim; ++j) {
          const double x = rows.At(1 + i, j);
          ASSERT_EQ(out[i * dim + j], static_cast<float>(x)) << "row " << i << " dim " << j;
          sum += x * x;
        }
        EXPECT_NEAR(inverse[i] * std::max(std::sqrt(sum), 1e-6), 1.0, 1e-5) << "row " << i;
      }
    }
  }
  // A row whose float sum of squares overflows comes back normalised, inverse norm 1.
  Rows huge(ElemType::kF32, 2, 20);
  for (int32_t j = 0; j < 20; ++j) {
    huge.Set(0, j, 1e30 * (j + 1));
    huge.Set(1, j, j);
  }
  std::vector<float> out(40), inverse(2);
  EXPECT_FALSE(kernels().widen_rows(&huge.Block(), 0, 2, 20, out.data(), inverse.data()));
  EXPECT_EQ(inverse[0], 1.0f);
  double norm = 0.0;
  for (int32_t j = 0; j < 20; ++j) norm += static_cast<double>(out[j]) * out[j];
  EXPECT_NEAR(norm, 1.0, 1e-6);
  EXPECT_EQ(out[20 + 5], 5.0f);  // the other row keeps its values
}

TEST_P(SoftMatchTest, PackPanelsTransposesAndScales) {
  const int32_t width = kernels().panel_width;
  std::mt19937_64 rng(kSeed + 3);
  std::normal_distribution<float> normal;
  for (int32_t count : {1, width - 1, width, 2 * width + 3}) {
    for (int32_t dim : {1, 5, width, 2 * width + 1, 128}) {
      SCOPED_TRACE("count " + std::to_string(count) + " dim " + std::to_string(dim));
      const int64_t stride = 2 * dim + 1;
      std::vector<float> rows(static_cast<size_t>(count) * stride), norms(2 * count);
      for (float& x : rows) x = normal(rng);
      for (float& x : norms) x = std::fabs(normal(rng)) + 0.1f;
      const int32_t panels = (count + width - 1) / width;
      std::vector<float> packed(static_cast<size_t>(panels) * dim * width, -1.0f);
      kernels().pack_panels(rows.data(), stride, norms.data(), 2, count, dim, packed.data());
      for (int32_t p = 0; p < panels; ++p) {
        for (int32_t j = 0; j < dim; ++j) {
          for (int32_t l = 0; l < width; ++l) {
            const int32_t row = p * width + l;
            const float expected = row < count ? rows[row * stride + j] * norms[2 * row] : 0.0f;
            ASSERT_EQ(packed[(static_cast<int64_t>(p) * dim + j) * width + l], expected)
                << "panel " << p << " j " << j << " lane " << l;
          }
        }
      }
    }
  }
}

// The reference engine's merge: sum = c_0 x_0, sum += c_k x_k, then sum / total, in double.
template <typename Out>
std::vector<Out> ReferenceMerge(const Rows& rows, const std::vector<MergeTerm>& terms,
                                double total) {
  std::vector<Out> out(static_cast<size_t>(rows.dim()));
  for (int32_t j = 0; j < rows.dim(); ++j) {
    double sum = terms[0].count * rows.At(static_cast<int32_t>(terms[0].row), j);
    for (size_t k = 1; k < terms.size(); ++k) {
      sum += terms[k].count * rows.At(static_cast<int32_t>(terms[k].row), j);
    }
    out[j] = static_cast<Out>(sum / total);
  }
  return out;
}

template <typename Out>
void ExpectMergeExact(const KernelTable& kernels, const Rows& rows,
                      const std::vector<MergeTerm>& terms) {
  double total = 0.0;
  for (const MergeTerm& term : terms) total += term.count;
  const std::vector<Out> expected = ReferenceMerge<Out>(rows, terms, total);
  std::vector<Out> actual(expected.size());
  if constexpr (sizeof(Out) == sizeof(float)) {
    kernels.merge_row_f32(&rows.Block(), terms.data(), static_cast<int32_t>(terms.size()), total,
                          rows.dim(), actual.data());
  } else {
    kernels.merge_row_f64(&rows.Block(), terms.data(), static_cast<int32_t>(terms.size()), total,
                          rows.dim(), actual.data());
  }
  for (int32_t j = 0; j < rows.dim(); ++j) {
    ASSERT_EQ(std::memcmp(&actual[j], &expected[j], sizeof(Out)), 0)
        << "element " << j << ": " << actual[j] << " vs " << expected[j] << " (" << terms.size()
        << " terms, total " << total << ")";
  }
}

TEST_P(SoftMatchTest, MergeRowIsBitExact) {
  std::mt19937_64 rng(kSeed + 4);
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kF64,
                        ElemType::kE4M3, ElemType::kE5M2}) {
    for (int32_t dim : {1, 3, 8, 16, 31, 128, 130}) {
      SCOPED_TRACE(ElemTypeName(type) + " dim " + std::to_string(dim));
      const Rows rows = RandomRows(type, 80, dim, Shape::kIndependent, 3.0, rng, 1);
      for (int32_t num_terms : {2, 2, 3, 4, 5, 7, 8, 17, 70}) {
        for (bool unit_counts : {true, false}) {
          std::vector<MergeTerm> terms;
          for (int32_t k = 0; k < num_terms; ++k) {
            terms.push_back({static_cast<int64_t>(rng() % 80),
                             unit_counts ? 1.0 : static_cast<double>(1 + rng() % 9)});
          }
          ExpectMergeExact<float>(kernels(), rows, terms);
          ExpectMergeExact<double>(kernels(), rows, terms);
        }
      }
    }
  }
}

// Values at the edges of float: pairs whose float sum overflows, means that are subnormal
// (or round to zero), zeros, signed zeros.
TEST_P(SoftMatchTest, MergeRowIsBitExactAtTheEdgesOfFloat) {
  const std::vector<double> specials = {3.4e38,  3.3e38,         -3.4e38, 1e-38, 1.2e-38, 3e-39,
                                        1.4e-45, -1.4e-45,       0.0,     -0.0,  1.0,     1.0000001,
                                        2.8e-45, 1.17549435e-38, 6e-39,   1e-30};
  for (ElemType type : {ElemType::kF32, ElemType::kBF16, ElemType::kF16}) {
    const auto n = static_cast<int32_t>(specials.size());
    Rows rows(type, n, 37);
    for (int32_t r = 0; r < n; ++r) {
      for (int32_t j = 0; j < 37; ++j) rows.Set(r, j, specials[(r + j) % n] * (j % 2 ? 1 : -1));
    }
    SCOPED_TRACE(ElemTypeName(type));
    for (int32_t a = 0; a < n; ++a) {
      for (int32_t b = 0; b < n; ++b) {
        ExpectMergeExact<float>(kernels(), rows, {{a, 1.0}, {b, 1.0}});
        ExpectMergeExact<float>(kernels(), rows, {{a, 1.0}, {b, 1.0}, {(a + b) % n, 1.0}});
      }
    }
  }
}

// Every path of the SIMD merge (merge_simd.h), at dims that reach its two-vector loop, its
// one-vector loop and its scalar tail: unit pairs (the float mean), unit counts with any
// total (products skipped), power-of-two totals (multiplying by the reciprocal) with unit and
// mixed counts, other totals (the rounded quotient, checked against float's rounding
// boundaries), and counts up to 2^32, whose products with float rows are not exact.
TEST_P(SoftMatchTest, MergeRowIsBitExactOnEveryPath) {
  std::mt19937_64 rng(kSeed + 6);
  const std::vector<std::vector<double>> count_sets = {
      {1, 1},       {1, 1, 1},    {1, 1, 1, 1},        {1, 1, 1, 1, 1},   {1, 1, 1, 1, 1, 1, 1},
      {1, 3},       {3, 5},       {1, 1, 2},           {2, 2, 4},         {1, 2},
      {2, 3, 4},    {1, 1, 1, 2}, {4294967295.0, 1.0}, {1, 2147483649.0}, {3, 1073741825.0, 7}};
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kF64,
                        ElemType::kE4M3, ElemType::kE5M2}) {
    for (int32_t dim : {1, 4, 7, 8, 9, 16, 24, 33, 128}) {
      SCOPED_TRACE(ElemTypeName(type) + " dim " + std::to_string(dim));
      const Rows rows = RandomRows(type, 16, dim, Shape::kIndependent, 5.0, rng);
      for (const std::vector<double>& counts : count_sets) {
        std::vector<MergeTerm> terms;
        for (double count : counts) terms.push_back({static_cast<int64_t>(rng() % 16), count});
        ExpectMergeExact<float>(kernels(), rows, terms);
        ExpectMergeExact<double>(kernels(), rows, terms);
      }
    }
  }
}

// Quotients s / t on and right next to a midpoint between two floats, where the float
// rounding of an approximate quotient would differ from that of the correctly rounded one:
// float64 rows (so any sum s can be made) a, 0, 0, ... with s = a = t * m + k ulps for a
// float midpoint m. Also float rows whose sum is exactly 3 * m.
TEST_P(SoftMatchTest, MergeRowIntoFloatRoundsQuotientsNextToFloatMidpoints) {
  constexpr int32_t kDim = 40;  // both vector loops and the scalar tail at every level
  std::mt19937_64 rng(kSeed + 7);
  for (double total : {3.0, 5.0, 6.0, 7.0, 9.0, 11.0, 12.0, 13.0, 100.0, 4294967295.0}) {
    Rows rows(ElemType::kF64, 2, kDim);  // row 1 stays zero
    for (int32_t j = 0; j < kDim; ++j) {
      // A float midpoint m of random magnitude and parity, and a within a few ulps of t * m.
      const float f = std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f,
                                 static_cast<int>(rng() % 200) - 100);
      const double m = static_cast<double>(f) + std::ldexp(1.0, std::ilogb(f) - 24);
      double a = total * m;  // exact: 25 + 32 bits at most
      for (int32_t k = static_cast<int32_t>(j % 11) - 5; k != 0; k += k > 0 ? -1 : 1) {
        a = std::nextafter(a, k > 0 ? INFINITY : -INFINITY);
      }
      rows.Set(0, j, j % 4 == 3 ? -a : a);
    }
    SCOPED_TRACE("total " + std::to_string(total));
    // Unit counts (total - 1 zero rows) and mixed counts (one zero row of count total - 1).
    std::vector<MergeTerm> unit(static_cast<size_t>(std::min(total, 13.0)), MergeTerm{1, 1.0});
    unit[0].row = 0;
    if (total <= 13.0) ExpectMergeExact<float>(kernels(), rows, unit);
    ExpectMergeExact<float>(kernels(), rows, {{0, 1.0}, {1, total - 1.0}});
    ExpectMergeExact<double>(kernels(), rows, {{0, 1.0}, {1, total - 1.0}});
  }
  // Float rows: x0 + 2 * x1 = 3 * m exactly, for m = 1 + 2^-24 (halfway between 1 and the
  // next float) and its multiples by powers of two, so the mean is exactly a tie.
  for (ElemType type : {ElemType::kF32, ElemType::kF64}) {
    Rows rows(type, 2, kDim);
    for (int32_t j = 0; j < kDim; ++j) {
      const int scale = (j % 9) * 7 - 28;
      const double sign = j % 2 ? -1.0 : 1.0;
      rows.Set(0, j, sign * std::ldexp(0.5 + 3 * 0x1p-24, scale));
      rows.Set(1, j, sign * std::ldexp(1.25, scale));
    }
    SCOPED_TRACE(ElemTypeName(type));
    ExpectMergeExact<float>(kernels(), rows, {{0, 1.0}, {1, 2.0}});
    ExpectMergeExact<float>(kernels(), rows, {{0, 1.0}, {1, 1.0}, {1, 1.0}});
  }
}

TEST_P(SoftMatchTest, ConvertAndStreamCopyExactly) {
  std::mt19937_64 rng(kSeed + 5);
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kF64,
                        ElemType::kE4M3, ElemType::kE5M2}) {
    for (int32_t dim : {1, 15, 16, 17, 128}) {
      const Rows rows = RandomRows(type, 4, dim, Shape::kIndependent, 1.0, rng, 2);
      std::vector<float> as_float(static_cast<size_t>(dim)), block(static_cast<size_t>(3) * dim);
      std::vector<double> as_double(static_cast<size_t>(dim));
      kernels().convert_row_f32(&rows.Block(), 2, dim, as_float.data());
      kernels().convert_row_f64(&rows.Block(), 2, dim, as_double.data());
      kernels().convert_rows_f32(&rows.Block(), 1, 3, dim, block.data());
      for (int32_t j = 0; j < dim; ++j) {
        EXPECT_EQ(as_float[j], static_cast<float>(rows.At(2, j)));
        EXPECT_EQ(as_double[j], rows.At(2, j));
        for (int32_t i = 0; i < 3; ++i)
          EXPECT_EQ(block[i * dim + j], static_cast<float>(rows.At(1 + i, j)));
      }
    }
  }
  std::vector<float> in(1000), out(1100, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  for (int64_t shift : {0, 1, 3, 16, 17}) {
    for (int64_t count : {0, 1, 15, 16, 33, 999}) {
      std::fill(out.begin(), out.end(), -1.0f);
      EXPECT_TRUE(kernels().stream_floats(in.data(), count, out.data() + shift));
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[shift + i], in[i]) << shift << " " << i;
      EXPECT_EQ(out[shift + count], -1.0f) << "wrote past the end";
      // An Inf or NaN anywhere (the unaligned head, the streamed middle, the tail) is noticed.
      for (int64_t at : {int64_t{0}, count / 2, count - 1}) {
        if (at < 0 || at >= count) continue;
        for (float bad : {std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::nanf("")}) {
          const float kept = in[at];
          in[at] = bad;
          EXPECT_FALSE(kernels().stream_floats(in.data(), count, out.data() + shift))
              << "shift " << shift << ", count " << count << ", at " << at;
          in[at] = kept;
        }
      }
      // The largest finite floats are finite.
      std::vector<float> big(static_cast<size_t>(count), -std::numeric_limits<float>::max());
      EXPECT_TRUE(kernels().stream_floats(big.data(), count, out.data() + shift));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, SoftMatchTest, ::testing::ValuesIn(SupportedSimdLevels()),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           const std::string_view name = SimdLevelName(info.param);
                           return std::string(1, static_cast<char>(name[0] - 'a' + 'A')) +
                                  std::string(name.substr(1));
                         });

TEST(SimdDispatchTest, DetectsALevelThatRunsHere) {
  const SimdLevel level = DetectSimdLevel();
  EXPECT_TRUE(SimdLevelSupported(level));
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kScalar));
  EXPECT_EQ(KernelsFor(level).name, SimdLevelName(level));
  const std::vector<SimdLevel> levels = SupportedSimdLevels();
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  EXPECT_EQ(levels.back(), level);
}

}  // namespace
}  // namespace centroidkv::cpu
