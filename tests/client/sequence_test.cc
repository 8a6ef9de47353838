// Sequence (client/sequence.cc) through real servers on loopback: the splices, applied to a
// worker's cache with CacheRows, give exactly the cache that the same online policy run
// synchronously with the in-process reference engine gives (in order, out of order, late;
// fp16 splices are the engine's rows rounded once; fp8 splices are codes in the cache's own
// scales, re-merges included);
// 32 layers stay at their budget; a replica killed mid-sequence loses nothing; a cancelled
// sequence leaves no job on the server (its /metrics say so).
#include "centroidkv/client/sequence.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "centroidkv/client/replica_pool.h"
#include "centroidkv/common/dtype.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/service/prometheus_text.h"
#include "tests/testing/server_process.h"

namespace centroidkv::client {
namespace {

using Clock = std::chrono::steady_clock;

// One head's rows in a worker's cache: float32, or fp8 codes held as floats (0..255).
struct HeadRows {
  std::vector<float> keys;
  std::vector<float> values;
  std::vector<uint32_t> counts;
  bool operator==(const HeadRows&) const = default;
};
using LayerRows = std::vector<HeadRows>;    // [H]
using CacheState = std::vector<LayerRows>;  // [L]

// The token stream: keys and values of every (token, layer), [H, d] each, drawn around a
// few prototypes so that merging finds real neighbours.
struct Tokens {
  int32_t layers, heads, dim;
  std::vector<std::vector<float>> keys;  // [token * layers + layer] -> [H * dim]
  std::vector<std::vector<float>> values;
  const float* key(int64_t t, int32_t l) const { return keys[t * layers + l].data(); }
  const float* value(int64_t t, int32_t l) const { return values[t * layers + l].data(); }
};

Tokens MakeTokens(int64_t count, int32_t layers, int32_t heads, int32_t dim, uint64_t seed) {
  Tokens tokens{layers, heads, dim, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> prototypes(static_cast<size_t>(8 * dim));
  for (float& p : prototypes) p = normal(rng);
  std::uniform_int_distribution<int> pick(0, 7);
  for (int64_t t = 0; t < count * layers; ++t) {
    std::vector<float> k(static_cast<size_t>(heads * dim)), v(k.size());
    for (int32_t h = 0; h < heads; ++h) {
      const int proto = pick(rng);
      for (int32_t j = 0; j < dim; ++j) {
        k[static_cast<size_t>(h * dim + j)] =
            prototypes[static_cast<size_t>(proto * dim + j)] + 0.3f * normal(rng);
        v[static_cast<size_t>(h * dim + j)] = normal(rng);
      }
    }
    tokens.keys.push_back(std::move(k));
    tokens.values.push_back(std::move(v));
  }
  return tokens;
}

// A worker's cache: rows appended per token, splices applied where CacheRows places them.
class WorkerCache {
 public:
  WorkerCache(int32_t layers, int32_t heads, int32_t dim)
      : rows_(layers),
        state_(static_cast<size_t>(layers), LayerRows(static_cast<size_t>(heads))),
        dim_(dim) {}

  void Append(const Tokens& tokens, int64_t t) {
    for (size_t l = 0; l < state_.size(); ++l) {
      for (size_t h = 0; h < state_[l].size(); ++h) {
        const float* k = tokens.key(t, static_cast<int32_t>(l)) + h * static_cast<size_t>(dim_);
        const float* v = tokens.value(t, static_cast<int32_t>(l)) + h * static_cast<size_t>(dim_);
        HeadRows& head = state_[l][h];
        head.keys.insert(head.keys.end(), k, k + dim_);
        head.values.insert(head.values.end(), v, v + dim_);
        head.counts.push_back(1);
      }
    }
    rows_.AppendToken();
  }

  // Applies one splice; false when it was stale (dropped).
  bool Apply(const Splice& splice) {
    absl::StatusOr<std::optional<SpliceRows>> place = rows_.Place(splice);
    EXPECT_TRUE(place.ok()) << place.status();
    if (!place.ok() || !place->has_value()) return false;
    const SpliceRows r = **place;
    std::vector<float> codes_k, codes_v;  // fp8 splices: their codes, as floats
    if (IsFp8(splice.dtype)) {
      codes_k.assign(splice.keys.begin(), splice.keys.end());
      codes_v.assign(splice.values.begin(), splice.values.end());
    } else {
      EXPECT_EQ(splice.dtype, DType::kFloat32);
    }
    const auto* keys = IsFp8(splice.dtype) ? codes_k.data()
                                           : reinterpret_cast<const float*>(splice.keys.data());
    const auto* values = IsFp8(splice.dtype)
                             ? codes_v.data()
                             : reinterpret_cast<const float*>(splice.values.data());
    const size_t d = static_cast<size_t>(dim_), n = static_cast<size_t>(splice.rows_per_head);
    for (size_t h = 0; h < state_[splice.layer].size(); ++h) {
      HeadRows& head = state_[splice.layer][h];
      const auto b = static_cast<ptrdiff_t>(r.row_begin), e = static_cast<ptrdiff_t>(r.row_end);
      head.keys.erase(head.keys.begin() + b * dim_, head.keys.begin() + e * dim_);
      head.keys.insert(head.keys.begin() + b * dim_, keys + h * n * d, keys + (h + 1) * n * d);
      head.values.erase(head.values.begin() + b * dim_, head.values.begin() + e * dim_);
      head.values.insert(head.values.begin() + b * dim_, values + h * n * d,
                         values + (h + 1) * n * d);
      head.counts.erase(head.counts.begin() + b, head.counts.begin() + e);
      head.counts.insert(head.counts.begin() + b,
                         splice.counts.begin() + static_cast<ptrdiff_t>(h * n),
                         splice.counts.begin() + static_cast<ptrdiff_t>((h + 1) * n));
    }
    return true;
  }

  int64_t rows(int32_t layer) const { return rows_.rows(layer); }
  const CacheState& state() const { return state_; }

 private:
  CacheRows rows_;
  CacheState state_;
  int32_t dim_;
};

// The engine's options for one job of the sequence (what Sequence sends).
CompressOptions JobOptions(const SequenceOptions& o, int64_t target) {
  CompressOptions c = o.compression;
  c.target_ratio.reset();
  c.target_tokens = target;
  c.sink_tokens = 0;
  c.recent_tokens = 0;
  c.exact_target = true;
  c.pad_heads = true;
  c.compute_assignment = false;
  return c;
}

// The scales of `layer` as SequenceOptions gives them (1, per layer, or per layer and head).
std::vector<float> LayerScales(const std::vector<float>& scales, const SequenceOptions& o,
                               int32_t layer) {
  if (scales.size() <= 1) return scales;
  if (scales.size() == static_cast<size_t>(o.num_layers)) return {scales[layer]};
  return {scales.begin() + layer * o.num_heads, scales.begin() + (layer + 1) * o.num_heads};
}

// Runs the engine on per-head rows (count-0 rows left out, ragged when heads differ); fp8
// rows (codes) with the layer's scales in and out.
LayerRows EngineCompress(const LayerRows& input, int32_t dim, int64_t target,
                         const SequenceOptions& o, int32_t layer) {
  std::vector<float> keys, values;
  std::vector<uint32_t> counts;
  std::vector<int64_t> offsets = {0};
  int64_t longest = 0;
  for (const HeadRows& head : input) {
    for (size_t r = 0; r < head.counts.size(); ++r) {
      if (head.counts[r] == 0) continue;
      keys.insert(keys.end(), head.keys.begin() + static_cast<ptrdiff_t>(r * dim),
                  head.keys.begin() + static_cast<ptrdiff_t>((r + 1) * dim));
      values.insert(values.end(), head.values.begin() + static_cast<ptrdiff_t>(r * dim),
                    head.values.begin() + static_cast<ptrdiff_t>((r + 1) * dim));
      counts.push_back(head.counts[r]);
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(counts.size()) - offsets.back());
    offsets.push_back(static_cast<int64_t>(counts.size()));
  }
  bool ragged = false;
  for (size_t h = 0; h + 1 < offsets.size(); ++h) ragged |= offsets[h + 1] - offsets[h] != longest;
  LayerView view;
  view.num_heads = static_cast<int32_t>(input.size());
  view.num_tokens = static_cast<int32_t>(longest);
  view.key_dim = dim;
  view.value_dim = dim;
  view.keys = keys.data();
  view.values = values.data();
  view.counts = counts.data();
  view.head_offsets = ragged ? offsets.data() : nullptr;
  CompressOptions options = JobOptions(o, target);
  std::vector<uint8_t> key_codes, value_codes;  // fp8: the codes, held as floats until here
  const std::vector<float> key_scales = LayerScales(o.key_scales, o, layer);
  const std::vector<float> value_scales = LayerScales(o.value_scales, o, layer);
  if (IsFp8(o.dtype)) {
    key_codes.assign(keys.begin(), keys.end());
    value_codes.assign(values.begin(), values.end());
    view.dtype = o.dtype;
    view.keys = key_codes.data();
    view.values = value_codes.data();
    view.key_scales = key_scales;
    view.value_scales = value_scales;
    options.result_dtype = o.dtype;
    options.result_key_scales = key_scales;
    options.result_value_scales = value_scales;
  }
  absl::StatusOr<CompressResult> result = testutil::ReferenceEngine().Compress(view, options);
  EXPECT_TRUE(result.ok()) << result.status();
  LayerRows out(input.size());
  if (!result.ok()) return out;
  if (IsFp8(o.dtype)) {
    result->keys.assign(result->fp8_keys.begin(), result->fp8_keys.end());
    result->values.assign(result->fp8_values.begin(), result->fp8_values.end());
  }
  for (size_t h = 0; h < input.size(); ++h) {
    const int64_t b = result->offsets[h], e = result->offsets[h + 1];
    out[h].keys.assign(result->keys.begin() + b * dim, result->keys.begin() + e * dim);
    out[h].values.assign(result->values.begin() + b * dim, result->values.begin() + e * dim);
    out[h].counts.assign(result->counts.begin() + b, result->counts.begin() + e);
  }
  return out;
}

void AppendRows(const LayerRows& part, LayerRows* to) {
  for (size_t h = 0; h < part.size(); ++h) {
    HeadRows& head = (*to)[h];
    head.keys.insert(head.keys.end(), part[h].keys.begin(), part[h].keys.end());
    head.values.insert(head.values.end(), part[h].values.begin(), part[h].values.end());
    head.counts.insert(head.counts.end(), part[h].counts.begin(), part[h].counts.end());
  }
}

LayerRows RawRows(const Tokens& tokens, int32_t layer, int64_t first, int64_t end) {
  LayerRows rows(static_cast<size_t>(tokens.heads));
  for (int64_t t = first; t < end; ++t) {
    for (int32_t h = 0; h < tokens.heads; ++h) {
      const float* k = tokens.key(t, layer) + h * tokens.dim;
      const float* v = tokens.value(t, layer) + h * tokens.dim;
      rows[h].keys.insert(rows[h].keys.end(), k, k + tokens.dim);
      rows[h].values.insert(rows[h].values.end(), v, v + tokens.dim);
      rows[h].counts.push_back(1);
    }
  }
  return rows;
}

// The same online policy, synchronously, with the reference engine in-process: the cache
// the worker must end with after `count` tokens once every splice is applied.
CacheState SynchronousReference(const Tokens& tokens, int64_t count, const SequenceOptions& o) {
  CacheState state;
  const int64_t chunk_entries = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(o.chunk_ratio * o.chunk_tokens - 1e-9)), 1, o.chunk_tokens);
  const int64_t room = o.budget_entries - o.sink_tokens - (o.recent_tokens + o.chunk_tokens - 1);
  for (int32_t layer = 0; layer < tokens.layers; ++layer) {
    std::vector<LayerRows> regions;
    int64_t next = o.sink_tokens;
    for (int64_t position = 1; position <= count; ++position) {
      if (position - next < o.recent_tokens + o.chunk_tokens) continue;
      LayerRows chunk = RawRows(tokens, layer, next, next + o.chunk_tokens);
      regions.push_back(o.policy == OnlinePolicy::kFixedBudget
                            ? chunk
                            : EngineCompress(chunk, tokens.dim, chunk_entries, o, layer));
      next += o.chunk_tokens;
      if (o.policy != OnlinePolicy::kFixedBudget) continue;
      auto rows_of = [](const LayerRows& r) { return static_cast<int64_t>(r[0].counts.size()); };
      int64_t middle = 0;
      for (const LayerRows& r : regions) middle += rows_of(r);
      while (middle > room && !(regions.size() == 1 && rows_of(regions[0]) <= 1)) {
        const size_t take = regions.size() >= 2 ? 2 : 1;
        LayerRows joined(static_cast<size_t>(tokens.heads));
        int64_t rows = 0;
        for (size_t i = 0; i < take; ++i) {
          AppendRows(regions[i], &joined);
          rows += rows_of(regions[i]);
        }
        const int64_t target = std::max<int64_t>(1, rows - (middle - room));
        LayerRows merged = EngineCompress(joined, tokens.dim, target, o, layer);
        middle += rows_of(merged) - rows;
        regions.erase(regions.begin(), regions.begin() + static_cast<ptrdiff_t>(take));
        regions.insert(regions.begin(), std::move(merged));
      }
    }
    LayerRows cache = RawRows(tokens, layer, 0, std::min<int64_t>(o.sink_tokens, count));
    for (const LayerRows& r : regions) AppendRows(r, &cache);
    if (count > next) AppendRows(RawRows(tokens, layer, next, count), &cache);
    state.push_back(std::move(cache));
  }
  return state;
}

SequenceOptions SmallOptions(OnlinePolicy policy) {
  SequenceOptions o{.num_layers = 3,
                    .num_heads = 2,
                    .key_dim = 8,
                    .value_dim = 8,
                    .sink_tokens = 4,
                    .recent_tokens = 8,
                    .chunk_tokens = 16,
                    .policy = policy,
                    .chunk_ratio = 0.5};
  o.budget_entries = 48;  // room for 48 - 4 - 23 = 21 merged rows per head
  o.compression.chunk_size = 8;
  o.backend = BackendKind::kReference;
  return o;
}

// Appends token t of every layer and ends it.
absl::Status FeedToken(Sequence& sequence, const Tokens& tokens, int64_t t) {
  for (int32_t l = 0; l < tokens.layers; ++l) {
    if (absl::Status s = sequence.Append(l, tokens.key(t, l), tokens.value(t, l)); !s.ok())
      return s;
  }
  return sequence.EndToken();
}

// Feeds `count` tokens; applies whatever splices have arrived after each token when
// `apply_as_they_come`, else keeps them in `held`. Flushes at the end.
void Feed(Sequence& sequence, const Tokens& tokens, int64_t count, WorkerCache* cache,
          bool apply_as_they_come, std::vector<Splice>* held) {
  for (int64_t t = 0; t < count; ++t) {
    ASSERT_TRUE(FeedToken(sequence, tokens, t).ok()) << sequence.status();
    cache->Append(tokens, t);
    for (Splice& s : sequence.TakeSplices()) {
      if (apply_as_they_come) {
        cache->Apply(s);
      } else {
        held->push_back(std::move(s));
      }
    }
  }
  ASSERT_TRUE(sequence.Flush().ok()) << sequence.status();
  for (Splice& s : sequence.TakeSplices()) {
    if (apply_as_they_come) {
      cache->Apply(s);
    } else {
      held->push_back(std::move(s));
    }
  }
}

class SequenceTest : public testutil::ServerTest {};

TEST_F(SequenceTest, FixedRatioSplicesEqualTheEngineOnEachChunk) {
  const SequenceOptions o = SmallOptions(OnlinePolicy::kFixedRatio);
  const Tokens tokens = MakeTokens(150, o.num_layers, o.num_heads, o.key_dim, 11);
  auto client = Connect();
  auto sequence = Sequence::Open(*client, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  WorkerCache cache(o.num_layers, o.num_heads, o.key_dim);
  Feed(**sequence, tokens, 150, &cache, true, nullptr);
  // (150 - 4 - 8) / 16 = 8 chunks per layer, each 16 -> 8 entries.
  const SequenceStats stats = (*sequence)->stats();
  EXPECT_EQ(stats.jobs_planned, 8);
  EXPECT_EQ(stats.jobs_submitted, 8 * o.num_layers);
  EXPECT_EQ(stats.remerges_planned, 0);
  EXPECT_EQ(cache.rows(0), 4 + 8 * 8 + (150 - 4 - 128));
  EXPECT_EQ(stats.planned_rows, cache.rows(0));
  EXPECT_TRUE(cache.state() == SynchronousReference(tokens, 150, o));
  EXPECT_TRUE((*sequence)->Close().ok());
}

TEST_F(SequenceTest, HalfPrecisionSplicesAreTheEngineResultRoundedOnce) {
  SequenceOptions o = SmallOptions(OnlinePolicy::kFixedRatio);
  o.dtype = DType::kFloat16;
  const int64_t count = 80;  // chunks [4, 20), [20, 36), [36, 52), [52, 68) per layer
  const Tokens tokens = MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 16);
  auto halves = [](const float* row, size_t n) {
    std::vector<uint16_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(row[i]);
    return out;
  };
  const size_t row = static_cast<size_t>(o.num_heads * o.key_dim);
  auto client = Connect();
  auto sequence = Sequence::Open(*client, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  for (int64_t t = 0; t < count; ++t) {
    for (int32_t l = 0; l < o.num_layers; ++l) {
      const std::vector<uint16_t> k = halves(tokens.key(t, l), row);
      const std::vector<uint16_t> v = halves(tokens.value(t, l), row);
      ASSERT_TRUE((*sequence)->Append(l, k.data(), v.data()).ok());
    }
    ASSERT_TRUE((*sequence)->EndToken().ok());
  }
  ASSERT_TRUE((*sequence)->Flush().ok());
  const std::vector<Splice> splices = (*sequence)->TakeSplices();
  ASSERT_EQ(splices.size(), 4u * static_cast<size_t>(o.num_layers));
  for (const Splice& splice : splices) {
    ASSERT_EQ(splice.dtype, DType::kFloat16);
    ASSERT_EQ(splice.rows_per_head, 8);
    // The same chunk, head-major fp16, through the reference engine in-process.
    const int64_t n = splice.end_position - splice.first_position;
    std::vector<uint16_t> keys, values;
    for (int32_t h = 0; h < o.num_heads; ++h) {
      for (int64_t t = splice.first_position; t < splice.end_position; ++t) {
        const auto k = halves(tokens.key(t, static_cast<int32_t>(splice.layer)) + h * o.key_dim,
                              static_cast<size_t>(o.key_dim));
        const auto v = halves(tokens.value(t, static_cast<int32_t>(splice.layer)) + h * o.key_dim,
                              static_cast<size_t>(o.key_dim));
        keys.insert(keys.end(), k.begin(), k.end());
        values.insert(values.end(), v.begin(), v.end());
      }
    }
    LayerView view;
    view.dtype = DType::kFloat16;
    view.num_heads = o.num_heads;
    view.num_tokens = static_cast<int32_t>(n);
    view.key_dim = o.key_dim;
    view.value_dim = o.value_dim;
    view.keys = keys.data();
    view.values = values.data();
    absl::StatusOr<CompressResult> expected =
        testutil::ReferenceEngine().Compress(view, JobOptions(o, 8));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(splice.counts, expected->counts);
    const std::vector<uint16_t> expected_keys =
        halves(expected->keys.data(), expected->keys.size());
    const std::vector<uint16_t> expected_values =
        halves(expected->values.data(), expected->values.size());
    ASSERT_EQ(splice.keys.size(), 2 * expected_keys.size());
    EXPECT_EQ(std::memcmp(splice.keys.data(), expected_keys.data(), splice.keys.size()), 0);
    EXPECT_EQ(std::memcmp(splice.values.data(), expected_values.data(), splice.values.size()), 0);
  }
}

TEST_F(SequenceTest, FixedBudgetSplicesOutOfOrderGiveTheSameCache) {
  const SequenceOptions o = SmallOptions(OnlinePolicy::kFixedBudget);
  const int64_t count = 200;
  const Tokens tokens = MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 12);
  auto client = Connect();
  auto sequence = Sequence::Open(*client, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  WorkerCache in_order(o.num_layers, o.num_heads, o.key_dim);
  std::vector<Splice> held;
  Feed(**sequence, tokens, count, &in_order, false, &held);
  EXPECT_GT((*sequence)->stats().remerges_planned, 0);
  for (const Splice& s : held) in_order.Apply(s);
  const CacheState expected = SynchronousReference(tokens, count, o);
  EXPECT_TRUE(in_order.state() == expected);
  for (int32_t l = 0; l < o.num_layers; ++l) EXPECT_LE(in_order.rows(l), o.budget_entries);

  // Reversed: every re-merge lands before the splices it supersedes, which are then stale.
  for (uint64_t seed : {0, 1, 2}) {
    std::vector<Splice> shuffled = held;
    if (seed == 0) {
      std::reverse(shuffled.begin(), shuffled.end());
    } else {
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(seed));
    }
    WorkerCache late(o.num_layers, o.num_heads, o.key_dim);
    for (int64_t t = 0; t < count; ++t) late.Append(tokens, t);
    int stale = 0;
    for (const Splice& s : shuffled) stale += late.Apply(s) ? 0 : 1;
    EXPECT_TRUE(late.state() == expected) << "order seed " << seed;
    if (seed == 0) {
      EXPECT_GT(stale, 0);
    }
  }
}

// The token stream of an fp8 cache: each element's E4M3 code (held as a float) in the
// layer's key scale (one per layer) and the one value scale.
SequenceOptions Fp8Options(OnlinePolicy policy) {
  SequenceOptions o = SmallOptions(policy);
  o.dtype = DType::kFp8E4M3;
  o.key_scales = {0.01f, 0.0125f, 0.015f};  // per layer (vLLM's k_scale)
  o.value_scales = {0.008f};                 // every layer and head
  return o;
}

Tokens Fp8Codes(Tokens tokens, const SequenceOptions& o) {
  for (size_t i = 0; i < tokens.keys.size(); ++i) {
    const int32_t layer = static_cast<int32_t>(i % static_cast<size_t>(tokens.layers));
    for (float& x : tokens.keys[i]) x = FloatToFp8(x / o.key_scales[layer], o.dtype);
    for (float& x : tokens.values[i]) x = FloatToFp8(x / o.value_scales[0], o.dtype);
  }
  return tokens;
}

void FeedFp8(Sequence& sequence, const Tokens& codes, int64_t count, WorkerCache* cache,
             std::vector<Splice>* held) {
  const size_t row = static_cast<size_t>(codes.heads * codes.dim);
  for (int64_t t = 0; t < count; ++t) {
    for (int32_t l = 0; l < codes.layers; ++l) {
      const std::vector<uint8_t> k(codes.key(t, l), codes.key(t, l) + row);
      const std::vector<uint8_t> v(codes.value(t, l), codes.value(t, l) + row);
      ASSERT_TRUE(sequence.Append(l, k.data(), v.data()).ok());
    }
    ASSERT_TRUE(sequence.EndToken().ok()) << sequence.status();
    cache->Append(codes, t);
    for (Splice& s : sequence.TakeSplices()) held->push_back(std::move(s));
  }
  ASSERT_TRUE(sequence.Flush().ok()) << sequence.status();
  for (Splice& s : sequence.TakeSplices()) held->push_back(std::move(s));
}

TEST_F(SequenceTest, Fp8SplicesAreCodesInTheCacheScalesReMergesIncluded) {
  for (OnlinePolicy policy : {OnlinePolicy::kFixedRatio, OnlinePolicy::kFixedBudget}) {
    const SequenceOptions o = Fp8Options(policy);
    const int64_t count = 200;
    const Tokens codes = Fp8Codes(MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 17), o);
    auto client = Connect();
    auto sequence = Sequence::Open(*client, o);
    ASSERT_TRUE(sequence.ok()) << sequence.status();
    WorkerCache cache(o.num_layers, o.num_heads, o.key_dim);
    std::vector<Splice> splices;
    FeedFp8(**sequence, codes, count, &cache, &splices);
    ASSERT_FALSE(splices.empty());
    for (const Splice& splice : splices) {
      ASSERT_EQ(splice.dtype, DType::kFp8E4M3);
      ASSERT_EQ(splice.keys.size(), static_cast<size_t>(o.num_heads * splice.rows_per_head *
                                                        o.key_dim));  // one byte a code
      cache.Apply(splice);
    }
    if (policy == OnlinePolicy::kFixedBudget) {
      EXPECT_GT((*sequence)->stats().remerges_planned, 0);
      for (int32_t l = 0; l < o.num_layers; ++l) EXPECT_LE(cache.rows(l), o.budget_entries);
    }
    // Bit for bit the same policy run with the reference engine on the codes, in the same
    // static scales: every re-merge read rows in the scales it wrote them in.
    EXPECT_TRUE(cache.state() == SynchronousReference(codes, count, o))
        << "policy " << static_cast<int>(policy);
    EXPECT_TRUE((*sequence)->Close().ok());
  }
}

TEST_F(SequenceTest, ThirtyTwoLayersStayAtTheirBudget) {
  SequenceOptions o{.num_layers = 32,
                    .num_heads = 2,
                    .key_dim = 16,
                    .value_dim = 16,
                    .sink_tokens = 4,
                    .recent_tokens = 16,
                    .chunk_tokens = 16};
  o.budget_entries = 80;  // room for 80 - 4 - 31 = 45 merged rows per head
  o.compression.chunk_size = 16;
  o.backend = BackendKind::kCpu;
  const int64_t count = 480;
  const Tokens tokens = MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 13);
  auto client = Connect();
  auto sequence = Sequence::Open(*client, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  WorkerCache cache(o.num_layers, o.num_heads, o.key_dim);
  int64_t flushes = 0;
  for (int64_t t = 0; t < count; ++t) {
    ASSERT_TRUE(FeedToken(**sequence, tokens, t).ok()) << (*sequence)->status();
    cache.Append(tokens, t);
    for (const Splice& s : (*sequence)->TakeSplices()) cache.Apply(s);
    if (t % 60 == 59) {  // once every splice so far is applied, every layer is at budget
      ASSERT_TRUE((*sequence)->Flush().ok());
      for (const Splice& s : (*sequence)->TakeSplices()) cache.Apply(s);
      const int64_t planned = (*sequence)->stats().planned_rows;
      for (int32_t l = 0; l < o.num_layers; ++l) {
        EXPECT_EQ(cache.rows(l), planned) << "layer " << l << " token " << t;
        EXPECT_LE(cache.rows(l), o.budget_entries) << "layer " << l << " token " << t;
        for (const HeadRows& head : cache.state()[static_cast<size_t>(l)]) {
          uint64_t tokens_standing = 0;
          for (uint32_t c : head.counts) tokens_standing += c;
          EXPECT_EQ(tokens_standing, static_cast<uint64_t>(t + 1));  // no token lost
        }
      }
      ++flushes;
    }
  }
  EXPECT_EQ(flushes, 8);
  const SequenceStats stats = (*sequence)->stats();
  EXPECT_EQ(stats.jobs_planned, stats.remerges_planned);  // chunks wait as they are
  EXPECT_GT(stats.remerges_planned, 20);
  EXPECT_EQ(stats.jobs_submitted, stats.jobs_planned * o.num_layers);
  EXPECT_TRUE(cache.state() == SynchronousReference(tokens, count, o));
  EXPECT_TRUE((*sequence)->Close().ok());
}

TEST(SequenceFailoverTest, AReplicaKilledMidSequenceLosesNothing) {
  std::vector<std::unique_ptr<centroidkv::testing::ServerProcess>> servers;
  std::vector<std::string> targets;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<centroidkv::testing::ServerProcess>());
    ASSERT_TRUE(servers.back()->Start({"--listen", "127.0.0.1:0", "--threads", "1"}))
        << servers.back()->Log();
    targets.push_back(servers.back()->target());
  }
  PoolOptions pool_options;
  pool_options.client.target = targets[0] + "," + targets[1] + "," + targets[2];
  pool_options.jobs_per_stream = 2;
  pool_options.retry.initial_backoff = std::chrono::milliseconds(10);
  auto pool = ReplicaPool::Connect(pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  SequenceOptions o{.num_layers = 8,
                    .num_heads = 8,
                    .key_dim = 128,
                    .value_dim = 128,
                    .sink_tokens = 4,
                    .recent_tokens = 32,
                    .chunk_tokens = 128,
                    .budget_entries = 400,
                    .compression = {.chunk_size = 128}};
  // The reference engine at head dim 128: tens of ms per job, so the jobs seen in flight are
  // still computing when the SIGKILL lands (an answer already on its way is not resent).
  o.backend = BackendKind::kReference;
  const int64_t count = 900;
  const Tokens tokens = MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 14);
  auto sequence = Sequence::Open(**pool, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  WorkerCache cache(o.num_layers, o.num_heads, o.key_dim);
  // The controller: once a third of the tokens are in, SIGKILL the first replica seen with
  // two jobs in flight (a lane learns its replica with its first answer).
  std::atomic<int64_t> fed{0};
  std::atomic<bool> done{false};
  int killed = -1;
  std::string killed_peer;
  std::thread controller([&] {
    while (!done && killed < 0) {
      if (fed >= count / 3) {
        const PoolStats stats = (*pool)->stats();
        for (int i = 0; i < 3 && killed < 0; ++i) {
          const std::string peer = "ipv4:" + targets[static_cast<size_t>(i)];
          auto it = stats.replicas.find(peer);
          if (it != stats.replicas.end() && it->second.in_flight >= 2) {
            servers[static_cast<size_t>(i)]->Signal(SIGKILL);
            killed_peer = peer;
            killed = i;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  bool fed_all = true;  // no ASSERT while the controller runs: it must be joined first
  for (int64_t t = 0; t < count && fed_all; ++t) {
    fed_all = FeedToken(**sequence, tokens, t).ok();
    cache.Append(tokens, t);
    for (const Splice& s : (*sequence)->TakeSplices()) cache.Apply(s);
    fed = t + 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a decode step
  }
  done = true;
  controller.join();
  ASSERT_TRUE(fed_all) << (*sequence)->status();
  ASSERT_GE(killed, 0) << "no replica was seen with a job in flight";
  ASSERT_TRUE((*sequence)->Flush().ok()) << (*sequence)->status();
  for (const Splice& s : (*sequence)->TakeSplices()) cache.Apply(s);
  const PoolStats stats = (*pool)->stats();
  EXPECT_GT(stats.replicas.at(killed_peer).resent, 0);
  EXPECT_EQ(stats.returned_error, 0);
  EXPECT_EQ(stats.returned_ok, (*sequence)->stats().jobs_submitted);
  EXPECT_TRUE(cache.state() == SynchronousReference(tokens, count, o));
  EXPECT_TRUE((*sequence)->Close().ok());
}

TEST(SequenceCancelTest, ACancelledSequenceLeavesNoJobOnTheServer) {
  service::ServerOptions server_options = testutil::TestServerOptions("127.0.0.1:0");
  server_options.metrics_listen = "127.0.0.1:0";
  server_options.worker_threads = 1;
  auto server = service::Server::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto metric = [&](const char* name) {
    absl::StatusOr<std::string> text = service::testing::ScrapeMetrics((*server)->metrics_port());
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) return -1.0;
    auto families = service::testing::ParsePrometheusText(*text);
    EXPECT_TRUE(families.ok()) << families.status();
    if (!families.ok()) return -1.0;
    absl::StatusOr<double> value = service::testing::SampleValue(*families, name, name);
    return value.ok() ? *value : -1.0;
  };
  ClientOptions client_options;
  client_options.target = (*server)->target();
  auto client = Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  SequenceOptions o{.num_layers = 4,
                    .num_heads = 8,
                    .key_dim = 64,
                    .value_dim = 64,
                    .sink_tokens = 4,
                    .recent_tokens = 16};
  o.chunk_tokens = 1024;  // reference jobs of 8 x 1024 rows: seconds each on one thread
  o.policy = OnlinePolicy::kFixedRatio;
  o.compression.chunk_size = 512;
  o.backend = BackendKind::kReference;
  const int64_t count = 4 + 16 + 1024;
  const Tokens tokens = MakeTokens(count, o.num_layers, o.num_heads, o.key_dim, 15);
  auto sequence = Sequence::Open(**client, o);
  ASSERT_TRUE(sequence.ok()) << sequence.status();
  for (int64_t t = 0; t < count; ++t) {
    ASSERT_TRUE(FeedToken(**sequence, tokens, t).ok());
  }
  EXPECT_EQ((*sequence)->stats().jobs_in_flight, o.num_layers);
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (metric("centroidkv_jobs_in_flight") <= 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(metric("centroidkv_jobs_in_flight"), 0);
  (*sequence)->Cancel();
  EXPECT_TRUE((*sequence)->TakeSplices().empty());
  EXPECT_EQ((*sequence)->stats().jobs_in_flight, 0);
  EXPECT_EQ((*sequence)->EndToken().code(), absl::StatusCode::kCancelled);
  // The server drops every job of the stream: nothing in flight, no stream open.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((metric("centroidkv_jobs_in_flight") != 0 || metric("centroidkv_streams_open") != 0) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(metric("centroidkv_jobs_in_flight"), 0);
  EXPECT_EQ(metric("centroidkv_streams_open"), 0);
  EXPECT_LT(metric("centroidkv_entries_total"), 1);  // no result was computed to the end
}

// A client of nothing (no connection attempt): options are checked before any stream.
ClientOptions NowhereOptions() {
  ClientOptions client_options;
  client_options.target = "127.0.0.1:1";
  client_options.connect_timeout = std::chrono::milliseconds(0);
  return client_options;
}

TEST(SequenceOptionsTest, ABudgetWithNoRoomIsRefusedNamingTheField) {
  auto client = Client::Connect(NowhereOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  SequenceOptions o = SmallOptions(OnlinePolicy::kFixedBudget);
  o.budget_entries = 28;  // 28 - 4 - 23 = 1 < 2
  auto sequence = Sequence::Open(**client, o);
  EXPECT_EQ(sequence.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sequence.status().message().find("budget_entries"), std::string::npos);
}

TEST(SequenceOptionsTest, Fp8ScalesMissingOrBadOrForAnotherDTypeAreRefusedNamingTheField) {
  auto client = Client::Connect(NowhereOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  auto refused = [&](const SequenceOptions& o, const std::string& field, const std::string& why) {
    auto sequence = Sequence::Open(**client, o);
    EXPECT_EQ(sequence.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(sequence.status().message().find("SequenceOptions." + field), std::string::npos)
        << sequence.status();
    EXPECT_NE(sequence.status().message().find(why), std::string::npos) << sequence.status();
  };
  SequenceOptions o = Fp8Options(OnlinePolicy::kFixedRatio);
  o.key_scales.clear();
  refused(o, "key_scales", "needs 1, num_layers (3) or num_layers x num_heads (6)");
  o = Fp8Options(OnlinePolicy::kFixedRatio);
  o.value_scales = {1.0f, 1.0f};  // neither 1, 3 nor 6
  refused(o, "value_scales", "2 entries");
  for (float bad : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
    o = Fp8Options(OnlinePolicy::kFixedRatio);
    o.key_scales[1] = bad;
    refused(o, "key_scales", "must be finite and > 0");
  }
  o = SmallOptions(OnlinePolicy::kFixedRatio);
  o.value_scales = {1.0f};
  refused(o, "value_scales", "scales are for fp8 caches only");
  o = Fp8Options(OnlinePolicy::kFixedRatio);
  o.key_scales.assign(6, 0.02f);  // per layer and head
  EXPECT_NE(Sequence::Open(**client, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace centroidkv::client
