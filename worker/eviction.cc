// StreamingLLM, H2O-style and SnapKV eviction baselines.
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

namespace {

// Calls keep_of(head, budget) for every head longer than its budget.
template <typename KeepOf>
void EvictEachHead(KvCache* cache, const std::function<int64_t(int64_t)>& budget_of,
                   KeepOf keep_of) {
  for (int32_t layer = 0; layer < cache->num_layers(); ++layer) {
    for (int32_t h = 0; h < cache->num_kv_heads(); ++h) {
      HeadCache& head = cache->head(layer, h);
      const int64_t budget = budget_of(head.size());
      if (budget >= head.size()) continue;
      KeepEntries(&head, cache->head_size(), keep_of(head, budget));
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

void EvictStreamingLlm(KvCache* cache, double ratio, int32_t sinks) {
  EvictEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); },
      [sinks](const HeadCache& head, int64_t budget) { return StreamingLlmKeep(head, budget, sinks); });
}

void EvictStreamingLlmToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks) {
  EvictEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; },
      [sinks](const HeadCache& head, int64_t budget) { return StreamingLlmKeep(head, budget, sinks); });
}

absl::Status EvictHeavyHitters(KvCache* cache, double ratio, int32_t sinks, int32_t recent) {
  if (absl::Status s = CheckTracksAttention(*cache, "H2O"); !s.ok()) return s;
  EvictEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); },
      [sinks, recent](const HeadCache& head, int64_t budget) {
        return HeavyHittersKeep(head, budget, sinks, recent);
      });
  return absl::OkStatus();
}

absl::Status EvictHeavyHittersToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                       int32_t recent) {
  if (absl::Status s = CheckTracksAttention(*cache, "H2O"); !s.ok()) return s;
  EvictEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; },
      [sinks, recent](const HeadCache& head, int64_t budget) {
        return HeavyHittersKeep(head, budget, sinks, recent);
      });
  return absl::OkStatus();
}

namespace {

absl::Status EvictSnapKvEachHead(KvCache* cache, const std::function<int64_t(int64_t)>& budget_of,
                                 int32_t sinks, int32_t window, int32_t kernel) {
  if (absl::Status s = CheckTracksAttention(*cache, "SnapKV"); !s.ok()) return s;
  if (kernel < 1) return absl::InvalidArgumentError(absl::StrCat("SnapKV kernel ", kernel, " < 1"));
  EvictEachHead(cache, budget_of, [sinks, window, kernel](const HeadCache& head, int64_t budget) {
    return KeepTopScored(head.size(), SplitBudget(budget, sinks, window),
                         AveragePooled(head.attention, kernel));
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status EvictSnapKv(KvCache* cache, double ratio, int32_t sinks, int32_t window,
                         int32_t kernel) {
  return EvictSnapKvEachHead(
      cache, [ratio](int64_t n) { return BudgetEntries(n, ratio); }, sinks, window, kernel);
}

absl::Status EvictSnapKvToBudget(KvCache* cache, int64_t budget_entries, int32_t sinks,
                                 int32_t window, int32_t kernel) {
  return EvictSnapKvEachHead(
      cache, [budget_entries](int64_t) { return budget_entries; }, sinks, window, kernel);
}

}  // namespace centroidkv::worker
