// StreamingLLM, H2O-style and SnapKV eviction baselines, and the merging of what they drop.
#include "worker/eviction.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace centroidkv::worker {

int64_t BudgetEntries(int64_t n, double ratio) {
  const int64_t budget = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n)));
  return std::clamp<int64_t>(budget, std::min<int64_t>(1, n), n);
}

BudgetSplit SplitBudget(int64_t budget, int64_t sinks, int64_t recent) {
  BudgetSplit split;
  split.sinks = std::min(sinks, budget);
  split.recent = std::min(recent, budget - split.sinks);
  split.middle = budget - split.sinks - split.recent;
  return split;
}

void KeepEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& keep) {
  HeadCache kept;
  const bool attention = !head->attention.empty();
  for (int64_t i : keep) {
    const auto begin = static_cast<ptrdiff_t>(i * head_size);
    kept.keys.insert(kept.keys.end(), head->keys.begin() + begin,
                     head->keys.begin() + begin + head_size);
    kept.values.insert(kept.values.end(), head->values.begin() + begin,
                       head->values.begin() + begin + head_size);
    kept.counts.push_back(head->counts[static_cast<size_t>(i)]);
    if (attention) kept.attention.push_back(head->attention[static_cast<size_t>(i)]);
  }
  *head = std::move(kept);
}

void MergeEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& group_of,
                  int64_t groups) {
  const auto dim = static_cast<size_t>(head_size);
  const auto slots = static_cast<size_t>(groups);
  const bool attention = !head->attention.empty();
  std::vector<double> key_sum(slots * dim, 0.0), value_sum(slots * dim, 0.0);
  std::vector<double> attention_sum(slots, 0.0);
  std::vector<uint64_t> count_sum(slots, 0);
  std::vector<int64_t> first(slots, -1);
  for (int64_t i = 0; i < head->size(); ++i) {
    const int64_t g = group_of[static_cast<size_t>(i)];
    if (g < 0) continue;
    const auto slot = static_cast<size_t>(g);
    if (first[slot] < 0) first[slot] = i;
    const double c = head->counts[static_cast<size_t>(i)];
    const float* key = head->keys.data() + static_cast<size_t>(i) * dim;
    const float* value = head->values.data() + static_cast<size_t>(i) * dim;
    for (size_t j = 0; j < dim; ++j) {
      key_sum[slot * dim + j] += c * key[j];
      value_sum[slot * dim + j] += c * value[j];
    }
    count_sum[slot] += head->counts[static_cast<size_t>(i)];
    if (attention) attention_sum[slot] += head->attention[static_cast<size_t>(i)];
  }
  HeadCache out;
  out.keys.resize(slots * dim);
  out.values.resize(slots * dim);
  out.counts.resize(slots);
  if (attention) out.attention = attention_sum;
  for (size_t slot = 0; slot < slots; ++slot) {
    const auto row = static_cast<size_t>(first[slot]);
    if (count_sum[slot] == 0) {  // padding only: the row as it is
      std::copy_n(head->keys.begin() + row * dim, dim, out.keys.begin() + slot * dim);
      std::copy_n(head->values.begin() + row * dim, dim, out.values.begin() + slot * dim);
      continue;
    }
    const auto count = static_cast<double>(count_sum[slot]);
    for (size_t j = 0; j < dim; ++j) {
      out.keys[slot * dim + j] = static_cast<float>(key_sum[slot * dim + j] / count);
      out.values[slot * dim + j] = static_cast<float>(value_sum[slot * dim + j] / count);
    }
    out.counts[slot] = static_cast<uint32_t>(count_sum[slot]);
  }
  *head = std::move(out);
}

void KeepAndMergeEntries(HeadCache* head, int32_t head_size, const std::vector<int64_t>& keep,
                         int64_t first, int64_t end, double min_similarity) {
  const int64_t n = head->size();
  const auto dim = static_cast<size_t>(head_size);
  // Kept entry r is group r; a dropped one joins its most similar target's group, or none.
  std::vector<int64_t> group_of(static_cast<size_t>(n), -1);
  std::vector<int64_t> targets;  // entry indices in [first, end), ascending
  for (size_t r = 0; r < keep.size(); ++r) {
    group_of[static_cast<size_t>(keep[r])] = static_cast<int64_t>(r);
    if (keep[r] >= first && keep[r] < end) targets.push_back(keep[r]);
  }
  auto key = [&](int64_t i) { return head->keys.data() + static_cast<size_t>(i) * dim; };
  // Cosine as SPEC section 2 defines it, in double.
  std::vector<double> inverse_norm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double squares = 0.0;
    for (size_t j = 0; j < dim; ++j) squares += double{key(i)[j]} * key(i)[j];
    inverse_norm[static_cast<size_t>(i)] = 1.0 / std::max(std::sqrt(squares), 1e-6);
  }
  std::vector<bool> kept(static_cast<size_t>(n), false);
  for (int64_t i : keep) kept[static_cast<size_t>(i)] = true;
  for (int64_t i = 0; i < n && !targets.empty(); ++i) {
    if (kept[static_cast<size_t>(i)] || head->counts[static_cast<size_t>(i)] == 0) continue;
    int64_t best = -1;
    double best_score = -2.0;
    for (int64_t t : targets) {
      double dot = 0.0;
      for (size_t j = 0; j < dim; ++j) dot += double{key(i)[j]} * key(t)[j];
      const double score =
          dot * inverse_norm[static_cast<size_t>(i)] * inverse_norm[static_cast<size_t>(t)];
      if (score > best_score) {
        best_score = score;
        best = t;
      }
    }
    if (best_score >= min_similarity) {
      group_of[static_cast<size_t>(i)] = group_of[static_cast<size_t>(best)];
    }
  }
  MergeEntries(head, head_size, group_of, static_cast<int64_t>(keep.size()));
}

namespace {

// Calls keep_of(head, budget) for every head longer than its budget; with `evicted` merged,
// what it drops joins the kept entries between the protected windows of SplitBudget(budget,
// sinks, recent).
template <typename KeepOf>
void EvictEachHead(KvCache* cache, const std::function<int64_t(int64_t)>& budget_of,
                   int64_t sinks, int64_t recent, EvictedEntries evicted, KeepOf keep_of) {
  for (int32_t layer = 0; layer < cache->num_layers(); ++layer) {
    for (int32_t h = 0; h < cache->num_kv_heads(); ++h) {
      HeadCache& head = cache->head(layer, h);
      const int64_t budget = budget_of(head.size());
      if (budget >= head.size()) continue;
      if (!evicted.merged) {
        KeepEntries(&head, cache->head_size(), keep_of(head, budget));
        continue;
      }
      const BudgetSplit split = SplitBudget(budget, sinks, recent);
      KeepAndMergeEntries(&head, cache->head_size(), keep_of(head, budget), split.sinks,
                          head.size() - split.recent, evicted.min_similarity);
    }
  }
}

std::vector<int64_t> StreamingLlmKeep(const HeadCache& head, int64_t budget, int32_t sinks) {
  const int64_t n = head.size();
  const int64_t kept_sinks = std::min<int64_t>(sinks, budget);
  std::vector<int64_t> keep(static_cast<size_t>(kept_sinks));
  std::iota(keep.begin(), keep.end(), 0);
  for (int64_t i = n - (budget - kept_sinks); i < n; ++i) keep.push_back(i);
  return keep;
}

// Sinks, the newest `recent`, and the `middle` entries between them with the highest
// `score` (the older entry on ties), ascending.
std::vector<int64_t> KeepTopScored(int64_t n, const BudgetSplit& split,
                                   const std::vector<double>& score) {
  std::vector<int64_t> middle;
  for (int64_t i = split.sinks; i < n - split.recent; ++i) middle.push_back(i);
  std::stable_sort(middle.begin(), middle.end(), [&score](int64_t a, int64_t b) {
    return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
  });
  middle.resize(static_cast<size_t>(split.middle));
  std::vector<int64_t> keep(static_cast<size_t>(split.sinks));
  std::iota(keep.begin(), keep.end(), 0);
  keep.insert(keep.end(), middle.begin(), middle.end());
  for (int64_t i = n - split.recent; i < n; ++i) keep.push_back(i);
  std::sort(keep.begin(), keep.end());
  return keep;
}

// The mean of score over [i - kernel/2, i + kernel/2] clipped to the head (kvpress pads
// with zeros and divides by the kernel: the same ranking away from the ends).
std::vector<double> AveragePooled(const std::vector<double>& score, int32_t kernel) {
  const int64_t n = static_cast<int64_t>(score.size()), half = kernel / 2;
  std::vector<double> pooled(score.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(n - 1, i + half); ++j) {
      sum += score[static_cast<size_t>(j)];
    }
    pooled[static_cast<size_t>(i)] = sum / kernel;
  }
  return pooled;
}

absl::Status CheckTracksAttention(const KvCache& cache, const char* method) {
  if (cache.tracks_attention()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(method, " needs the attention accumulated during prefill: call "
                           "TrackAttention(true) before prefilling"));
}

// Sinks, the recent window and the most attended entries between them.
std::vector<int64_t> HeavyHittersKeep(const HeadCache& head, int64_t budget, int32_t sinks,
                                      int32_t recent) {
  return KeepTopScored(head.size(), SplitBudget(budget, sinks, recent), head.attention);
}

}  // namespace

void EvictStreamingLlm(KvCache* cache, double ratio, int32_t sinks, EvictedEntries evicted) {
  // StreamingLLM keeps nothing between its windows: the recent one is the rest of the budget.
  EvictEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); }, sinks, cache->position(),
      evicted,
      [sinks](const HeadCache& head, int64_t budget) { return StreamingLlmKeep(head, budget, sinks); });
}

void EvictStreamingLlmToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                               EvictedEntries evicted) {
  EvictEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; }, sinks, budget_entries,
      evicted,
      [sinks](const HeadCache& head, int64_t budget) { return StreamingLlmKeep(head, budget, sinks); });
}

absl::Status EvictHeavyHitters(KvCache* cache, double ratio, int32_t sinks, int32_t recent,
                               EvictedEntries evicted) {
  if (absl::Status s = CheckTracksAttention(*cache, "H2O"); !s.ok()) return s;
  EvictEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); }, sinks, recent, evicted,
      [sinks, recent](const HeadCache& head, int64_t budget) {
        return HeavyHittersKeep(head, budget, sinks, recent);
      });
  return absl::OkStatus();
}

absl::Status EvictHeavyHittersToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                       int32_t recent, EvictedEntries evicted) {
  if (absl::Status s = CheckTracksAttention(*cache, "H2O"); !s.ok()) return s;
  EvictEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; }, sinks, recent, evicted,
      [sinks, recent](const HeadCache& head, int64_t budget) {
        return HeavyHittersKeep(head, budget, sinks, recent);
      });
  return absl::OkStatus();
}

namespace {

absl::Status EvictSnapKvEachHead(KvCache* cache, const std::function<int64_t(int64_t)>& budget_of,
                                 int32_t sinks, int32_t window, int32_t kernel,
                                 EvictedEntries evicted) {
  if (absl::Status s = CheckTracksAttention(*cache, "SnapKV"); !s.ok()) return s;
  if (kernel < 1) return absl::InvalidArgumentError(absl::StrCat("SnapKV kernel ", kernel, " < 1"));
  EvictEachHead(cache, budget_of, sinks, window, evicted,
                [sinks, window, kernel](const HeadCache& head, int64_t budget) {
    return KeepTopScored(head.size(), SplitBudget(budget, sinks, window),
                         AveragePooled(head.attention, kernel));
  });
  return absl::OkStatus();
}

}  // namespace

std::vector<double> SnapKvScores(const HeadCache& head, int32_t kernel) {
  return AveragePooled(head.attention, kernel);
}

absl::Status EvictSnapKv(KvCache* cache, double ratio, int32_t sinks, int32_t window,
                         int32_t kernel, EvictedEntries evicted) {
  return EvictSnapKvEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); }, sinks, window, kernel,
      evicted);
}

absl::Status EvictSnapKvToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                 int32_t window, int32_t kernel, EvictedEntries evicted) {
  return EvictSnapKvEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; }, sinks, window, kernel,
      evicted);
}

}  // namespace centroidkv::worker
