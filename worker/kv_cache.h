// The KV cache of one sequence: for every layer and KV head, the cached entries' keys
// (after RoPE, as attention uses them), values and counts. An entry of count c stands for
// c original tokens (a centroid); attention adds ln(c) to its logit (SPEC section 2).
//
// Positions: position() is the true number of tokens fed so far, not the number of
// entries; RoPE of the next token uses it, so decoding after compression continues at
// the original length. Entries appended after compression get count 1.
//
// Exchange layout with the service (one layer): keys [H_kv, n, head_size] head-major
// float32, values the same, counts [H_kv, n] uint32. Heads of a layer may have different
// lengths (after passthrough heads, a similarity floor); ExportLayer then sends the heads
// ragged (one after another, with offsets: the protocol's head_tokens).
//
// Padding: a result padded to equal lengths (pad_heads / pad_to) holds count-0 rows.
// They stand for no token: attention masks them (transformer.cc), TotalEntries() does
// not count them, and ExportLayer leaves them out (the service takes count-0 rows only
// at the end of a head, and decoding appends after them).
//
// Thread-safety: none; one cache per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace centroidkv::worker {

// The entries of one KV head of one layer, entry-major: entry i's key is
// keys[i * head_size .. (i + 1) * head_size).
struct HeadCache {
  std::vector<float> keys;
  std::vector<float> values;
  std::vector<uint32_t> counts;
  // Attention probability each entry has received, summed over the query heads of this
  // KV head and over every query since it was cached (H2O's statistic). Kept only while
  // the cache tracks attention; otherwise empty.
  std::vector<double> attention;

  // Rows stored, count-0 padding included.
  int64_t size() const { return static_cast<int64_t>(counts.size()); }
  // Rows that stand for tokens (count > 0).
  int64_t real_entries() const;
};

// One layer in the exchange layout (owned buffers).
struct LayerTensors {
  int32_t num_heads = 0;
  int32_t num_tokens = 0;  // entries per head; the longest head's when ragged
  int32_t head_size = 0;
  std::vector<float> keys;       // [H, n, head_size], or [sum of head lengths, head_size]
  std::vector<float> values;     // the same
  std::vector<uint32_t> counts;  // [H, n], or [sum of head lengths]
  // [H + 1] when the heads differ in length: head h owns rows head_offsets[h] ..
  // head_offsets[h + 1]. Empty when every head holds num_tokens entries.
  std::vector<int64_t> head_offsets;
};

class KvCache {
 public:
  KvCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_size);

  int32_t num_layers() const { return num_layers_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t head_size() const { return head_size_; }

  // Tokens fed so far: the RoPE position of the next token.
  int64_t position() const { return position_; }
  void AdvancePosition() { ++position_; }

  HeadCache& head(int32_t layer, int32_t kv_head) { return heads_[Index(layer, kv_head)]; }
  const HeadCache& head(int32_t layer, int32_t kv_head) const {
    return heads_[Index(layer, kv_head)];
  }

  // Appends one token's keys and values for every KV head of `layer` (kv_dim floats each,
  // head h at [h * head_size, (h + 1) * head_size)), with count 1.
  void Append(int32_t layer, const float* keys, const float* values);

  // Real entries (count > 0) over all layers and heads, rows stored (count-0 padding
  // included), and the entries of an uncompressed cache.
  int64_t TotalEntries() const;
  int64_t TotalRows() const;
  int64_t UncompressedEntries() const { return position_ * num_layers_ * num_kv_heads_; }

  // Turns H2O's accumulated-attention statistic on (zeros for the entries present) or off.
  void TrackAttention(bool on);
  bool tracks_attention() const { return track_attention_; }

  // The layer's real entries in the exchange layout (count-0 padding left out), ragged
  // when its heads differ in length.
  absl::StatusOr<LayerTensors> ExportLayer(int32_t layer) const;
  // Replaces one head's entries (n = counts.size(); keys and values n * head_size floats);
  // count-0 rows are padding. InvalidArgument on a size mismatch. Attention statistics
  // restart at 0.
  absl::Status ReplaceHead(int32_t layer, int32_t kv_head, std::vector<float> keys,
                           std::vector<float> values, std::vector<uint32_t> counts);
  // Replaces rows [row_begin, row_end) of one head by `counts.size()` rows (keys and values
  // counts.size() * head_size floats each): a splice of online compression. OutOfRange for
  // rows outside the head, InvalidArgument on a size mismatch. Attention statistics of the
  // new rows start at 0.
  absl::Status SpliceRows(int32_t layer, int32_t kv_head, int64_t row_begin, int64_t row_end,
                          std::span<const float> keys, std::span<const float> values,
                          std::span<const uint32_t> counts);

 private:
  size_t Index(int32_t layer, int32_t kv_head) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_kv_heads_) +
           static_cast<size_t>(kv_head);
  }

  int32_t num_layers_;
  int32_t num_kv_heads_;
  int32_t head_size_;
  int64_t position_ = 0;
  bool track_attention_ = false;
  std::vector<HeadCache> heads_;  // [layer][kv_head]
};

}  // namespace centroidkv::worker
