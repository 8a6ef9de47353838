// Online (decode-time) compression of one sequence, the paper's online mode with the
// clustering out of process. The worker appends each new token's keys and values per layer;
// once a full chunk has left the protected recent window, the Sequence sends it as a layer
// job (one per layer) through any Client (a ReplicaPool resends the jobs of a lost replica)
// and hands back a Splice per layer: which token positions the rows of the worker's cache
// now stand for, and the entries (keys, values, counts) that replace them. The service keeps
// no state: every job carries what it needs, merged regions go back with their counts.
//
//   SequenceOptions options{.num_layers = 32, .num_heads = 8, .key_dim = 128, ...};
//   auto sequence = Sequence::Open(*client, options);
//   CacheRows rows(options.num_layers);           // the worker's row map
//   for each token:
//     for each layer: (*sequence)->Append(layer, k, v);   // [H, key_dim], [H, value_dim]
//     (*sequence)->EndToken(); rows.AppendToken();
//     for (Splice& s : (*sequence)->TakeSplices())  // whatever has arrived; never blocks
//       if (auto place = rows.Place(s); place.ok() && place->has_value()) replace rows
//
// Pipelining: jobs run while the worker decodes; until a splice is applied the worker
// attends over the uncompressed rows. Splices name token positions and carry a version, not
// row indices, so one applied late or out of order still lands right (CacheRows::Place),
// and one whose rows a newer splice already replaced is reported stale and dropped.
//
// fp8 caches (dtype kFp8E4M3 / kFp8E5M2 with the cache's key_scales / value_scales): rows go
// out as codes and splices come back as codes in the same scales.
//
// Policies (sinks and the recent window are never sent):
//   kFixedRatio   each chunk of chunk_tokens becomes ceil(chunk_ratio * chunk_tokens) entries.
//   kFixedBudget  a chunk stays as it is while there is room; while the regions between
//                 the sinks and the newest positions hold more than
//                 budget - sinks - (recent + chunk - 1) rows per head, the oldest region is
//                 merged together with the next one (typically: the merged region so far,
//                 with its counts, and the chunk that just left the recent window; one job)
//                 to the size that fits. Once every splice is applied a head holds at most
//                 budget_entries rows.
// The plan (which positions become how many entries, in which version) depends only on the
// token count, never on timing, so the cache a worker ends with is deterministic.
//
// Thread-safety: Append / EndToken / TakeSplices / Flush / Cancel may be called from any
// thread; one result thread per Sequence submits the re-merges whose inputs have arrived.
// CacheRows is not thread-safe (it belongs to the worker's cache).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/types/presets.h"

namespace centroidkv::client {

enum class OnlinePolicy { kFixedRatio, kFixedBudget };

struct SequenceOptions {
  int32_t num_layers = 0;
  int32_t num_heads = 0;  // KV heads per layer
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  DType dtype = DType::kFloat32;  // of the appended rows and of the splices' entries
  // fp8 dtypes only (and required there): the scales of the worker's fp8 cache, a row
  // element standing for code x scale. One entry (every layer and head), num_layers (one
  // per layer: vLLM's k_scale / v_scale) or num_layers x num_heads (per layer, then per KV
  // head). Every job sends its rows with its layer's scales and asks for fp8 results with
  // the same static scales, so that every row of the cache, appended, merged or re-merged,
  // keeps them.
  std::vector<float> key_scales{};
  std::vector<float> value_scales{};
  // The small-model preset (types/presets.h) unless set.
  int32_t sink_tokens = kSmallModelPreset.sink_tokens;      // the first positions: never sent
  int32_t recent_tokens = kSmallModelPreset.recent_tokens;  // the newest: never sent
  int32_t chunk_tokens = kSmallModelPreset.chunk_size;      // positions per new chunk
  OnlinePolicy policy = OnlinePolicy::kFixedBudget;
  double chunk_ratio = 0.5;    // kFixedRatio: a chunk keeps ceil(chunk_ratio * chunk_tokens)
  int64_t budget_entries = 0;  // kFixedBudget: rows per head once every splice is applied
  // The engine parameters of every job (chunk_size, min_similarity, max_passes, ...). The
  // sequence sets the target, sinks and recent (0: it sends only what may be merged),
  // exact_target and pad_heads (every head of a splice has the same number of rows),
  // compute_assignment (off) and result_dtype.
  CompressOptions compression{};
  BackendKind backend = BackendKind::kAuto;
  int32_t priority = 0;
};

// The entries that now stand for the token positions [first_position, end_position) of one
// layer, for every head: replace the rows of the worker's cache that stand for positions in
// that range (CacheRows::Place says which) by these rows_per_head rows per head.
struct Splice {
  uint32_t layer = 0;
  int64_t first_position = 0;
  int64_t end_position = 0;
  // Increases with every job the sequence plans; rows written by a newer splice are never
  // replaced by an older one.
  uint64_t version = 0;
  DType dtype = DType::kFloat32;
  int32_t num_heads = 0;
  int32_t rows_per_head = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  std::vector<uint8_t> keys;     // [H, rows_per_head, key_dim] of dtype
  std::vector<uint8_t> values;   // [H, rows_per_head, value_dim] of dtype
  std::vector<uint32_t> counts;  // [H, rows_per_head]; 0 marks a padding row (attention masks it)
};

struct SequenceStats {
  int64_t position = 0;          // tokens appended (EndToken calls)
  int64_t jobs_planned = 0;      // per layer: chunks merged and re-merges
  int64_t remerges_planned = 0;  // per layer
  int64_t jobs_submitted = 0;    // over all layers
  int64_t jobs_in_flight = 0;
  int64_t jobs_waiting = 0;      // re-merges whose inputs have not all arrived
  int64_t splices_returned = 0;  // handed out by TakeSplices
  // Rows per head once every planned splice is applied: sinks + merged regions + the
  // positions not yet in any chunk.
  int64_t planned_rows = 0;
};

class Sequence {
 public:
  // `client` must outlive the Sequence. InvalidArgument naming the field for bad options
  // (e.g. a budget that sinks and the recent window leave no room in).
  static absl::StatusOr<std::unique_ptr<Sequence>> Open(Client& client,
                                                        const SequenceOptions& options);
  ~Sequence();  // Cancel()
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  // Copies one token's keys [H, key_dim] and values [H, value_dim] (of options.dtype) for
  // `layer`. FailedPrecondition if the layer already has this token.
  absl::Status Append(int32_t layer, const void* keys, const void* values);
  // Ends the token (every layer must have it) and submits the jobs it makes due. Returns
  // the sequence's error if a job failed for good (the rows stay uncompressed) and
  // Cancelled after Cancel().
  absl::Status EndToken();
  // The splices that have arrived since the last call, in arrival order. Never blocks.
  std::vector<Splice> TakeSplices();
  // Waits until every planned job has come back (its splice ready to take) and returns the
  // sequence's status.
  absl::Status Flush();
  // Flush(), then ends the stream cleanly (half-close); a failed sequence is cancelled.
  // Nothing may be appended after it.
  absl::Status Close();
  // Cancels every job in flight (the server drops them) and plans nothing more; no splice
  // comes after it returns. Idempotent.
  void Cancel();

  absl::Status status() const;
  SequenceStats stats() const;
  const SequenceOptions& options() const;

  struct State;  // defined in sequence.cc

 private:
  explicit Sequence(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The rows a splice replaces in one layer's cache (the same for every head).
struct SpliceRows {
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

// What each row of a worker's cache stands for, per layer (every head of a layer has the
// same rows): the token positions a run of rows covers and the version of the splice that
// wrote it (0: uncompressed tokens). Finds where a splice lands whatever order splices come.
class CacheRows {
 public:
  explicit CacheRows(int32_t num_layers);

  // Every layer gains one uncompressed row, for the next position.
  void AppendToken();
  // Where `splice` lands: the rows to replace by its rows_per_head rows (the map is updated
  // as if the caller did it), or nullopt when rows written by a newer splice already cover
  // its positions (stale: drop it). FailedPrecondition for positions not appended yet or a
  // splice that would cut through another splice's rows; InvalidArgument for a bad layer.
  absl::StatusOr<std::optional<SpliceRows>> Place(const Splice& splice);

  int64_t rows(int32_t layer) const;
  int64_t position() const { return position_; }

 private:
  struct Run {
    int64_t first_position = 0;
    int64_t end_position = 0;
    uint64_t version = 0;  // 0: one row per position
    int64_t rows = 0;
  };
  std::vector<std::vector<Run>> layers_;
  int64_t position_ = 0;
};

}  // namespace centroidkv::client
