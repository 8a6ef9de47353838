// The clustering engine: one interface, several backends (reference, CPU, CUDA), in the
// manner of FAISS's Index or ggml's backend interface. The unit of work is one layer job:
// all H KV heads of one layer of one sequence (SPEC.md section 2), because uniform_heads
// couples the heads and top-r selection is global across the chunks of a head.
//
// No CUDA, TBB or gRPC types appear here. Engines are thread-safe: Compress() may be
// called concurrently from many threads (backends keep per-thread scratch themselves).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/common/dtype.h"

namespace centroidkv {

// How the H x n x d elements of a key or value tensor are laid out in memory.
//   kHeadMajor:  [H, n, d], element (h, t, j) at (h * n + t) * d + j; counts [H, n].
//   kTokenMajor: [n, H, d], element (h, t, j) at (t * H + h) * d + j; counts [n, H].
enum class TensorLayout : uint8_t { kHeadMajor, kTokenMajor };

std::string_view TensorLayoutName(TensorLayout layout);

// One layer of one sequence in host memory, borrowed for the duration of Compress().
// Ragged layers (head_offsets set) give each head its own number of entries: the heads'
// rows one after another, head-major only, num_tokens = the longest head. Count-0 rows at
// the end of a head are padding (never merged, not returned, assignment -1). Backends never
// see either: ClusterEngine::Compress runs such a layer as regular jobs (kernels/ragged_layer.h).
struct LayerView {
  DType dtype = DType::kFloat32;
  TensorLayout layout = TensorLayout::kHeadMajor;
  int32_t num_heads = 0;
  int32_t num_tokens = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  const void* keys = nullptr;        // H * n * key_dim elements of dtype
  const void* values = nullptr;      // H * n * value_dim elements of dtype
  const uint32_t* counts = nullptr;  // H * n entries, or null for "all 1"
  // [H + 1] when ragged: head h owns rows head_offsets[h] .. head_offsets[h + 1]; else null.
  const int64_t* head_offsets = nullptr;

  // Entries of head `head` (num_tokens unless ragged), and rows of the whole layer.
  int32_t HeadTokens(int32_t head) const {
    return head_offsets == nullptr
               ? num_tokens
               : static_cast<int32_t>(head_offsets[head + 1] - head_offsets[head]);
  }
  int64_t TotalRows() const {
    return head_offsets == nullptr ? static_cast<int64_t>(num_heads) * num_tokens
                                   : head_offsets[num_heads];
  }
  // Element index of (head, token, 0) in keys / values, and of (head, token) in counts.
  int64_t KeyOffset(int32_t head, int32_t token) const { return RowIndex(head, token) * key_dim; }
  int64_t ValueOffset(int32_t head, int32_t token) const {
    return RowIndex(head, token) * value_dim;
  }
  int64_t RowIndex(int32_t head, int32_t token) const {
    if (head_offsets != nullptr) return head_offsets[head] + token;
    return layout == TensorLayout::kHeadMajor
               ? static_cast<int64_t>(head) * num_tokens + token
               : static_cast<int64_t>(token) * num_heads + head;
  }
  uint32_t CountAt(int32_t head, int32_t token) const {
    return counts == nullptr ? 1u : counts[RowIndex(head, token)];
  }
};

// SPEC.md section 2 parameters. Field names follow the SPEC and the wire API.
struct CompressOptions {
  static constexpr double kDefaultTargetRatio = 0.25;
  static constexpr int32_t kDefaultChunkSize = 256;
  static constexpr int32_t kDefaultSinkTokens = 16;
  static constexpr int32_t kDefaultRecentTokens = 64;
  static constexpr int32_t kDefaultMaxPasses = 8;

  // At most one of the two targets is set; with neither, target_ratio = 0.25.
  std::optional<double> target_ratio;   // rho in (0, 1]: t = ceil(rho * n)
  std::optional<int64_t> target_tokens;  // t >= 1 (clamped to n)
  int32_t chunk_size = kDefaultChunkSize;           // C >= 2
  int32_t sink_tokens = kDefaultSinkTokens;         // S >= 0, never merged
  int32_t recent_tokens = kDefaultRecentTokens;     // W >= 0, never merged
  std::optional<double> min_similarity;             // tau in [-1, 1]; unset = off
  double tighten_per_pass = 0.0;                    // delta >= 0
  int32_t max_passes = kDefaultMaxPasses;           // P >= 1
  bool uniform_heads = true;
  std::vector<int32_t> passthrough_heads;           // heads returned unchanged
  bool compute_assignment = true;                   // fill CompressResult::assignment
  // The element type of the result's rows: float32, or fp16 / bf16 (each element the
  // float32 result rounded once, to nearest even): half the bytes to write and to send when
  // the caller wants half precision anyway (the service's output_dtype).
  DType result_dtype = DType::kFloat32;

  // Above the backends (ClusterEngine::Compress), identical for every backend:
  // Keep merging past the similarity floor and max_passes until every compressed head has
  // exactly t entries, where sink and recent entries allow it: a second stage on the
  // result, floor off and each head on its own (merging twice equals merging once).
  bool exact_target = false;
  // Every head padded at its end with count-0 rows (zero keys and values) to the longest
  // head's length, or to pad_to rows when pad_to > 0 (FailedPrecondition if a head is longer).
  bool pad_heads = false;
  int32_t pad_to = 0;
  // kTokenMajor: rows [L, H, d] and counts [L, H], every head padded to L as with pad_heads.
  TensorLayout output_layout = TensorLayout::kHeadMajor;
};

// Why a head stopped merging (the wire's StopReason).
enum class StopReason : uint8_t {
  kTargetReached = 1,    // at most t entries
  kPassthrough = 2,      // a passthrough head, returned unchanged
  kSimilarityFloor = 3,  // no candidate edge reached the floor (this head's or, with
                         // uniform_heads, another compressed head's)
  kMaxPasses = 4,        // max_passes passes ran, each merging something
  kProtected = 5,        // sink and recent entries leave fewer than 2 to merge
  kUniformHeads = 6,     // uniform_heads: another compressed head could not merge
};
std::string_view StopReasonName(StopReason reason);

// Size limits enforced before any backend runs (RESOURCE_EXHAUSTED / INVALID_ARGUMENT).
struct EngineLimits {
  int32_t max_heads = 1024;
  int32_t max_tokens = 1 << 22;  // 4M entries per head
  int32_t max_dim = 4096;        // key_dim and value_dim
  int64_t max_layer_elements = int64_t{1} << 31;  // H * n * (dk + dv)
  // Largest CompressOptions::chunk_size (RESOURCE_EXHAUSTED above it). Matching costs
  // about n * C * key_dim / 4 per head and pass, so this bounds one job's work, and one
  // chunk's (the interval at which backends check for cancellation: tens of ms at 4096).
  int32_t max_chunk_size = 4096;
};

// The output of one layer job: heads concatenated along the entry axis, in
// CompressOptions::result_dtype: float32 rows in `keys` / `values`, or fp16 / bf16 rows (each
// the float32 result rounded once) in `half_keys` / `half_values`; the other pair is empty.
struct CompressResult {
  int32_t num_heads = 0;
  int32_t num_tokens = 0;  // input entries per head
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  DType dtype = DType::kFloat32;     // of the rows
  std::vector<int64_t> offsets;      // [H + 1]: head h owns rows offsets[h] .. offsets[h+1]
  std::vector<float> keys;           // [total, key_dim] when dtype is float32
  std::vector<float> values;         // [total, value_dim]
  std::vector<uint16_t> half_keys;   // [total, key_dim] fp16 / bf16 bits otherwise
  std::vector<uint16_t> half_values; // [total, value_dim]
  std::vector<uint32_t> counts;      // [total]
  std::vector<int32_t> assignment;   // [H, n] head-local output row of each input entry,
                                     // empty unless CompressOptions::compute_assignment
  int32_t passes_run = 0;            // passes that merged something (both stages of
                                     // exact_target)
  // The honest account, filled by ClusterEngine for every backend:
  TensorLayout layout = TensorLayout::kHeadMajor;  // of the rows (output_layout)
  int32_t padded_length = 0;         // rows per head when padded, else 0
  int64_t target_length = 0;         // t
  bool target_reached = false;       // every compressed head has at most t entries
  std::vector<int32_t> head_tokens;  // [H] input entries per head (padding included)
  std::vector<int32_t> head_entries; // [H] real (count > 0) output entries per head
  std::vector<uint64_t> head_input_tokens;  // [H] sum of the input counts per head
  std::vector<StopReason> stop_reasons;     // [H]

  int64_t total_entries() const { return offsets.empty() ? 0 : offsets.back(); }
  // Elements of the key / value rows, whichever array holds them.
  size_t key_elements() const { return dtype == DType::kFloat32 ? keys.size() : half_keys.size(); }
  size_t value_elements() const {
    return dtype == DType::kFloat32 ? values.size() : half_values.size();
  }
};

// Per-call control that is not part of the job: cooperative cancellation.
struct CompressControl {
  // When set and it becomes true, the engine stops within one chunk's work (the cpu and
  // reference backends check it inside their matching and merging loops) and returns
  // absl::CancelledError. Borrowed; must outlive the call.
  const std::atomic<bool>* cancelled = nullptr;
  // The job's deadline: past it the engine stops the same way (CancelledError); the caller
  // tells the two apart (Expired()). max() = none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  bool IsCancelled() const {
    return (cancelled != nullptr && cancelled->load(std::memory_order_relaxed)) || Expired();
  }
  bool Expired() const {
    return deadline != std::chrono::steady_clock::time_point::max() &&
           std::chrono::steady_clock::now() >= deadline;
  }
};

// One accelerator a backend runs on, as GetInfo lists it.
struct DeviceInfo {
  std::string backend;  // the engine's name(), e.g. "cuda:0"
  std::string name;     // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;
  int32_t compute_major = 0;  // compute capability, e.g. 9.0
  int32_t compute_minor = 0;
};

// Validated, resolved parameters of one job, shared by every backend.
struct LayerPlan {
  int64_t target_length = 0;           // t, the same for every head
  std::vector<bool> passthrough;       // [H]
  int32_t compressed_heads = 0;        // heads that are not passthrough
  std::vector<int32_t> head_lengths;   // [H] real entries per head (without count-0 padding)
  bool regular = true;                 // not ragged and no padding: the backend runs it as is
  CompressOptions options;

  // The similarity floor of pass p, or -infinity when the floor is off.
  double FloorForPass(int32_t pass) const;
};

class ClusterEngine {
 public:
  virtual ~ClusterEngine() = default;

  // "reference", "cpu", "cuda:0", ...
  virtual std::string_view name() const = 0;

  // Validates `layer` and `options` (InvalidArgument / ResourceExhausted naming the
  // field), plans the job, then runs the backend. Thread-safe.
  absl::StatusOr<CompressResult> Compress(const LayerView& layer, const CompressOptions& options,
                                          const CompressControl& control = {}) const;

  // The same job into `result`, reusing its buffers: a caller that runs many jobs (a server
  // thread, a benchmark) keeps one CompressResult per thread and pays for its memory once
  // instead of faulting in and zero-filling fresh pages every job. `result` may hold any
  // earlier result; on success it holds exactly what Compress() would return, on error its
  // contents are unspecified. Thread-safe for distinct `result`s.
  absl::Status CompressInto(const LayerView& layer, const CompressOptions& options,
                            CompressResult* result, const CompressControl& control = {}) const;

  // Whether the backend writes result rows in `dtype` itself. Every backend honours
  // CompressOptions::result_dtype, but one that writes float32 only rounds its rows in an
  // extra pass afterwards (RoundResultRows); a caller that rounds while copying anyway (the
  // service's encoder) asks for half rows only from a backend that writes them.
  virtual bool WritesResultDType(DType dtype) const { return dtype == DType::kFloat32; }

  const EngineLimits& limits() const { return limits_; }

 protected:
  explicit ClusterEngine(EngineLimits limits = {}) : limits_(limits) {}

  // Runs SPEC section 2 on a validated job. `out` arrives empty. The rows may be written in
  // plan.options.result_dtype (setting out->dtype) or in float32, which the caller then
  // rounds (RoundResultRows).
  virtual absl::Status CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                    const CompressControl& control,
                                    CompressResult* out) const = 0;

  // CompressInto()'s backend half: `out` holds an earlier result (any shape). The default
  // empties its arrays (keeping their capacity) and runs CompressImpl. A backend that
  // overwrites every element it sizes may override it to size the arrays without emptying
  // them first, so a job of the same shape as the last one writes no element twice.
  virtual absl::Status CompressReusingImpl(const LayerPlan& plan, const LayerView& layer,
                                           const CompressControl& control,
                                           CompressResult* out) const;

  // Whether the backend checks the job's data itself (what CheckLayerData checks), before it
  // acts on any element, and then returns CheckLayerData's error: Compress() then skips the
  // separate sweep over the data (a read of every key and value the backend reads anyway).
  // Such a job cancelled before it starts reports CANCELLED even when its data is bad.
  virtual bool ChecksLayerData() const { return false; }

 private:
  absl::Status Run(const LayerView& layer, const CompressOptions& options,
                   const CompressControl& control, bool reuse, CompressResult* result) const;

  EngineLimits limits_;
};

// Rounds a float32 result's rows to `dtype` (fp16 / bf16, nearest even) into half_keys /
// half_values and empties keys / values (keeping their capacity); nothing when the result
// is already in `dtype`.
void RoundResultRows(DType dtype, CompressResult* result);

// Checks the shape and parameters of a job without its data (keys and values may be null):
// what a server can reject as soon as a job is announced, before its bytes arrive.
absl::Status ValidateJobShape(const LayerView& layer, const CompressOptions& options,
                              const EngineLimits& limits);

// Checks every field of a job, the data included (NaN/Inf in keys or values, zero counts),
// and resolves it into a plan. Errors name the field as the wire API spells it.
absl::StatusOr<LayerPlan> PlanLayer(const LayerView& layer, const CompressOptions& options,
                                    const EngineLimits& limits);

// PlanLayer's check of the data alone: every key and value finite, every count at least 1
// and each head's counts summing within uint32. The error names the first offending element
// in (head, token, dim) order.
absl::Status CheckLayerData(const LayerView& layer);

}  // namespace centroidkv
