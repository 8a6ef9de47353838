// The per-sequence KV cache: appending, export to and replacement from the service layout.
#include "worker/kv_cache.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace centroidkv::worker {

KvCache::KvCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_size)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_size_(head_size),
      heads_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads)) {}

void KvCache::Append(int32_t layer, const float* keys, const float* values) {
  for (int32_t h = 0; h < num_kv_heads_; ++h) {
    HeadCache& entries = head(layer, h);
    const float* k = keys + static_cast<ptrdiff_t>(h) * head_size_;
    const float* v = values + static_cast<ptrdiff_t>(h) * head_size_;
    entries.keys.insert(entries.keys.end(), k, k + head_size_);
    entries.values.insert(entries.values.end(), v, v + head_size_);
    entries.counts.push_back(1);
    if (track_attention_) entries.attention.push_back(0.0);
  }
}

int64_t HeadCache::real_entries() const {
  return static_cast<int64_t>(counts.size()) - std::count(counts.begin(), counts.end(), 0u);
}

int64_t KvCache::TotalEntries() const {
  int64_t total = 0;
  for (const HeadCache& entries : heads_) total += entries.real_entries();
  return total;
}

int64_t KvCache::TotalRows() const {
  int64_t total = 0;
  for (const HeadCache& entries : heads_) total += entries.size();
  return total;
}

void KvCache::TrackAttention(bool on) {
  track_attention_ = on;
  for (HeadCache& entries : heads_) {
    entries.attention.assign(on ? entries.counts.size() : 0, 0.0);
  }
}

absl::StatusOr<LayerTensors> KvCache::ExportLayer(int32_t layer) const {
  LayerTensors out;
  out.num_heads = num_kv_heads_;
  out.head_size = head_size_;
  const size_t hs = static_cast<size_t>(head_size_);
  std::vector<int64_t> offsets = {0};
  for (int32_t h = 0; h < num_kv_heads_; ++h) {
    const HeadCache& entries = head(layer, h);
    for (size_t t = 0; t < entries.counts.size(); ++t) {
      if (entries.counts[t] == 0) continue;  // padding: stands for no token
      out.keys.insert(out.keys.end(), entries.keys.begin() + t * hs,
                      entries.keys.begin() + (t + 1) * hs);
      out.values.insert(out.values.end(), entries.values.begin() + t * hs,
                        entries.values.begin() + (t + 1) * hs);
      out.counts.push_back(entries.counts[t]);
    }
    offsets.push_back(static_cast<int64_t>(out.counts.size()));
  }
  int64_t longest = 0;
  bool equal = true;
  for (int32_t h = 0; h < num_kv_heads_; ++h) {
    const int64_t length = offsets[h + 1] - offsets[h];
    equal = equal && length == offsets[1];
    longest = std::max(longest, length);
  }
  if (longest > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(
        absl::StrCat("layer ", layer, ": a head holds ", longest, " entries"));
  }
  out.num_tokens = static_cast<int32_t>(longest);
  if (!equal) out.head_offsets = std::move(offsets);
  return out;
}

absl::Status KvCache::ReplaceHead(int32_t layer, int32_t kv_head, std::vector<float> keys,
                                  std::vector<float> values, std::vector<uint32_t> counts) {
  const size_t n = counts.size();
  const size_t floats = n * static_cast<size_t>(head_size_);
  if (keys.size() != floats || values.size() != floats) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " head ", kv_head, ": ", n, " entries need ", floats,
                     " key and value floats, got ", keys.size(), " and ", values.size()));
  }
  HeadCache& entries = head(layer, kv_head);
  entries.keys = std::move(keys);
  entries.values = std::move(values);
  entries.counts = std::move(counts);
  entries.attention.assign(track_attention_ ? n : 0, 0.0);
  return absl::OkStatus();
}

absl::Status KvCache::SpliceRows(int32_t layer, int32_t kv_head, int64_t row_begin,
                                 int64_t row_end, std::span<const float> keys,
                                 std::span<const float> values, std::span<const uint32_t> counts) {
  HeadCache& entries = head(layer, kv_head);
  if (row_begin < 0 || row_end < row_begin || row_end > entries.size()) {
    return absl::OutOfRangeError(absl::StrCat("layer ", layer, " head ", kv_head, ": rows [",
                                              row_begin, ", ", row_end, ") of ", entries.size()));
  }
  const size_t floats = counts.size() * static_cast<size_t>(head_size_);
  if (keys.size() != floats || values.size() != floats) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " head ", kv_head, ": ", counts.size(), " rows need ",
                     floats, " key and value floats, got ", keys.size(), " and ", values.size()));
  }
  const auto hs = static_cast<ptrdiff_t>(head_size_);
  const auto b = static_cast<ptrdiff_t>(row_begin), e = static_cast<ptrdiff_t>(row_end);
  entries.keys.erase(entries.keys.begin() + b * hs, entries.keys.begin() + e * hs);
  entries.keys.insert(entries.keys.begin() + b * hs, keys.begin(), keys.end());
  entries.values.erase(entries.values.begin() + b * hs, entries.values.begin() + e * hs);
  entries.values.insert(entries.values.begin() + b * hs, values.begin(), values.end());
  entries.counts.erase(entries.counts.begin() + b, entries.counts.begin() + e);
  entries.counts.insert(entries.counts.begin() + b, counts.begin(), counts.end());
  if (track_attention_) {
    entries.attention.erase(entries.attention.begin() + b, entries.attention.begin() + e);
    entries.attention.insert(entries.attention.begin() + b, counts.size(), 0.0);
  }
  return absl::OkStatus();
}

}  // namespace centroidkv::worker
