// Prefill, reference continuation, compressed continuation and their comparison.
#include "worker/evaluation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/sampler.h"

namespace centroidkv::worker {
namespace {

// log(sum(exp(x))) of logits, in double.
double LogSumExp(std::span<const float> x) {
  const double max = *std::max_element(x.begin(), x.end());
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - max);
  return max + std::log(sum);
}

}  // namespace

void Agreement::Add(const Agreement& other) {
  kl_sum += other.kl_sum;
  top1_matches += other.top1_matches;
  steps += other.steps;
  exact_matches += other.exact_matches;
}

double KlDivergence(std::span<const float> reference, std::span<const float> candidate) {
  const double lse_p = LogSumExp(reference), lse_q = LogSumExp(candidate);
  double kl = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double log_p = reference[i] - lse_p;
    const double log_q = candidate[i] - lse_q;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for equal distributions
}

Agreement CompareStep(std::span<const float> reference, std::span<const float> candidate) {
  Agreement a;
  a.steps = 1;
  a.kl_sum = KlDivergence(reference, candidate);
  a.top1_matches = Argmax(reference) == Argmax(candidate) ? 1 : 0;
  a.exact_matches =
      reference.size() == candidate.size() &&
              std::memcmp(reference.data(), candidate.data(), reference.size() * sizeof(float)) == 0
          ? 1
          : 0;
  return a;
}

absl::StatusOr<std::vector<std::vector<float>>> TeacherForce(Transformer& transformer,
                                                             std::span<const int32_t> tokens,
                                                             KvCache* cache) {
  std::vector<std::vector<float>> logits;
  logits.reserve(tokens.size());
  for (int32_t token : tokens) {
    if (absl::Status status = transformer.Forward(token, cache); !status.ok()) return status;
    logits.push_back(transformer.logits());
  }
  return logits;
}

absl::Status PrefillTracked(Transformer& transformer, std::span<const int32_t> tokens,
                            const PrefillTracking& tracking, KvCache* cache,
                            std::optional<KvCache>* window_cache) {
  cache->TrackAttention(tracking.whole);
  const size_t window =
      std::min(tokens.size(), static_cast<size_t>(std::max(0, tracking.observation_window)));
  const std::span<const int32_t> head = tokens.first(tokens.size() - window);
  const std::span<const int32_t> tail = tokens.last(window);
  if (absl::Status status = transformer.Prefill(head, cache); !status.ok()) return status;
  if (window == 0) {
    window_cache->reset();
    return absl::OkStatus();
  }
  *window_cache = *cache;
  (*window_cache)->TrackAttention(true);  // from here on: the window's queries only
  if (absl::Status status = transformer.Prefill(tail, &**window_cache); !status.ok()) {
    return status;
  }
  return transformer.Prefill(tail, cache);
}

absl::StatusOr<PrefilledText> PrefillText(Transformer& transformer, std::span<const int32_t> tokens,
                                          int32_t prefill, const PrefillTracking& tracking) {
  if (prefill < 1 || static_cast<size_t>(prefill) >= tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill ", prefill, " must leave a continuation in a text of ", tokens.size(), " tokens"));
  }
  PrefilledText text{transformer.NewCache(), {}, {}, std::nullopt};
  if (absl::Status status = PrefillTracked(transformer, tokens.first(static_cast<size_t>(prefill)),
                                           tracking, &text.cache, &text.window_cache);
      !status.ok()) {
    return status;
  }
  text.continuation.assign(tokens.begin() + prefill, tokens.end());
  KvCache full = text.cache;
  absl::StatusOr<std::vector<std::vector<float>>> reference =
      TeacherForce(transformer, text.continuation, &full);
  if (!reference.ok()) return reference.status();
  text.reference = *std::move(reference);
  return text;
}

absl::StatusOr<Agreement> EvaluateCompressed(Transformer& transformer, const PrefilledText& text,
                                             const CacheCompressor& compress,
                                             int64_t* entries_after, bool from_window) {
  if (from_window && !text.window_cache) {
    return absl::FailedPreconditionError(
        "this method reads the observation window's attention: prefill with "
        "PrefillTracking::observation_window > 0");
  }
  KvCache cache = from_window ? *text.window_cache : text.cache;
  if (absl::Status status = compress(&cache); !status.ok()) return status;
  if (entries_after != nullptr) *entries_after = cache.TotalEntries();
  absl::StatusOr<std::vector<std::vector<float>>> logits =
      TeacherForce(transformer, text.continuation, &cache);
  if (!logits.ok()) return logits.status();
  Agreement total;
  for (size_t i = 0; i < logits->size(); ++i) {
    total.Add(CompareStep(text.reference[i], (*logits)[i]));
  }
  return total;
}

}  // namespace centroidkv::worker
