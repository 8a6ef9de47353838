// Measuring what compression costs the model (SPEC section 4): prefill a text, keep the
// uncompressed continuation as the reference, compress a copy of the prefilled cache,
// teacher-force the same continuation, and compare the next-token distributions step by
// step: KL(full || compressed) and whether the top-1 tokens agree.
//
// Thread-safety: functions take a Transformer (one per thread) and their own caches.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/kv_cache.h"
#include "worker/transformer.h"

namespace centroidkv::worker {

// Sums over continuation steps; mergeable across texts.
struct Agreement {
  double kl_sum = 0.0;
  int64_t top1_matches = 0;
  int64_t steps = 0;
  int64_t exact_matches = 0;  // steps whose logits were bit-identical

  double mean_kl() const { return steps == 0 ? 0.0 : kl_sum / static_cast<double>(steps); }
  double top1() const {
    return steps == 0 ? 0.0 : static_cast<double>(top1_matches) / static_cast<double>(steps);
  }
  void Add(const Agreement& other);
};

// KL(softmax(reference) || softmax(candidate)), in double.
double KlDivergence(std::span<const float> reference, std::span<const float> candidate);

// One step's agreement; `Add` these over steps.
Agreement CompareStep(std::span<const float> reference, std::span<const float> candidate);

// Which attention statistics a prefill keeps, for the methods that read them.
struct PrefillTracking {
  bool whole = false;  // H2O: attention from every query, in the cache itself
  // SnapKV: when > 0, a second cache (window_cache) equal to the first whose statistic
  // covers only the last `observation_window` queries of the prefill.
  int32_t observation_window = 0;
};

// Feeds `tokens` into `*cache` (a new cache of the transformer's model), tracking as asked;
// with an observation window, also into `*window_cache`.
absl::Status PrefillTracked(Transformer& transformer, std::span<const int32_t> tokens,
                            const PrefillTracking& tracking, KvCache* cache,
                            std::optional<KvCache>* window_cache);

// A text after prefill: the cache, the continuation and the reference logits of the
// uncompressed continuation (reference[i] follows continuation[i]); window_cache as
// PrefillTracked makes it.
struct PrefilledText {
  KvCache cache;
  std::vector<int32_t> continuation;
  std::vector<std::vector<float>> reference;
  std::optional<KvCache> window_cache;
};

// Feeds tokens[0, prefill) (tracking as asked), then computes the reference over
// tokens[prefill, end) on a copy of the cache.
absl::StatusOr<PrefilledText> PrefillText(Transformer& transformer, std::span<const int32_t> tokens,
                                          int32_t prefill, const PrefillTracking& tracking);

// Feeds `tokens` one by one and returns the logits after each.
absl::StatusOr<std::vector<std::vector<float>>> TeacherForce(Transformer& transformer,
                                                             std::span<const int32_t> tokens,
                                                             KvCache* cache);

// Shrinks a prefilled cache (in place); a compression method under test.
using CacheCompressor = std::function<absl::Status(KvCache*)>;

// Compresses a copy of text.cache (of text.window_cache when `from_window`) with `compress`,
// teacher-forces the continuation and compares it with the reference. `entries_after`
// (optional) receives the compressed cache's entry count. FailedPrecondition when
// `from_window` and the text has no window cache.
absl::StatusOr<Agreement> EvaluateCompressed(Transformer& transformer, const PrefilledText& text,
                                             const CacheCompressor& compress,
                                             int64_t* entries_after = nullptr,
                                             bool from_window = false);

}  // namespace centroidkv::worker
