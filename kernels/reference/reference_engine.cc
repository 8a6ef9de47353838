// SPEC.md section 2, step by step, one head at a time within each pass. Everything is
// float64 until the result is written out as float32.
#include "kernels/reference/reference_engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace centroidkv {
namespace {

// The current (partly merged) entries of one head.
struct HeadState {
  int32_t length = 0;
  std::vector<double> keys;     // [length, key_dim]
  std::vector<double> values;   // [length, value_dim]
  std::vector<uint64_t> counts; // [length]
  std::vector<int32_t> owner;   // [n]: current row that represents input entry i
};

struct Edge {
  int32_t source = 0;       // a, a row of the current head
  int32_t destination = 0;  // b
  double score = 0.0;
};

HeadState LoadHead(const LayerView& layer, int32_t head) {
  HeadState state;
  state.length = layer.num_tokens;
  state.keys.resize(static_cast<size_t>(layer.num_tokens) * layer.key_dim);
  state.values.resize(static_cast<size_t>(layer.num_tokens) * layer.value_dim);
  state.counts.resize(layer.num_tokens);
  state.owner.resize(layer.num_tokens);
  for (int32_t t = 0; t < layer.num_tokens; ++t) {
    for (int32_t j = 0; j < layer.key_dim; ++j) {
      state.keys[static_cast<size_t>(t) * layer.key_dim + j] =
          LoadAsFloat(layer.keys, layer.dtype, layer.KeyOffset(head, t) + j);
    }
    for (int32_t j = 0; j < layer.value_dim; ++j) {
      state.values[static_cast<size_t>(t) * layer.value_dim + j] =
          LoadAsFloat(layer.values, layer.dtype, layer.ValueOffset(head, t) + j);
    }
    state.counts[t] = layer.CountAt(head, t);
    state.owner[t] = t;
  }
  return state;
}

double Cosine(const double* x, const double* y, int32_t dim) {
  double dot = 0.0, norm_x = 0.0, norm_y = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    dot += x[j] * y[j];
    norm_x += x[j] * x[j];
    norm_y += y[j] * y[j];
  }
  return dot / (std::max(std::sqrt(norm_x), 1e-6) * std::max(std::sqrt(norm_y), 1e-6));
}

// Steps 1-4: the best edge of every source in the compressible range, kept if it reaches
// the floor of this pass.
// Stops early (some edges missing) once `control` is cancelled: checked per source (at most
// EngineLimits::max_chunk_size / 2 cosines apart); the caller then drops the job.
std::vector<Edge> CandidateEdges(const HeadState& head, const LayerPlan& plan, int32_t key_dim,
                                 double floor, const CompressControl& control) {
  const CompressOptions& options = plan.options;
  const int64_t begin = options.sink_tokens;
  const int64_t end = int64_t{head.length} - options.recent_tokens;
  std::vector<Edge> edges;
  if (end - begin < 2) return edges;
  for (int64_t chunk = begin; chunk < end; chunk += options.chunk_size) {
    const int64_t chunk_end = std::min<int64_t>(chunk + options.chunk_size, end);
    for (int64_t a = chunk; a < chunk_end; a += 2) {
      if (control.IsCancelled()) return edges;
      Edge best{static_cast<int32_t>(a), -1, 0.0};
      for (int64_t b = chunk + 1; b < chunk_end; b += 2) {
        const double score = Cosine(&head.keys[a * key_dim], &head.keys[b * key_dim], key_dim);
        if (best.destination < 0 || score > best.score) {  // ties keep the lowest b
          best.destination = static_cast<int32_t>(b);
          best.score = score;
        }
      }
      if (best.destination >= 0 && best.score >= floor) edges.push_back(best);
    }
  }
  return edges;
}

// Step 6: the r best candidates, by score descending, then by source position ascending.
void KeepBest(std::vector<Edge>* edges, int64_t r) {
  std::sort(edges->begin(), edges->end(), [](const Edge& x, const Edge& y) {
    if (x.score != y.score) return x.score > y.score;
    return x.source < y.source;
  });
  edges->resize(static_cast<size_t>(r));
}

// Step 7: count-weighted merge of every kept source into its destination, then removal of
// the sources with the remaining rows in their original order.
void MergeAndCompact(HeadState* head, const std::vector<Edge>& kept, int32_t key_dim,
                     int32_t value_dim) {
  const int32_t m = head->length;
  std::vector<double> key_sum(static_cast<size_t>(m) * key_dim, 0.0);
  std::vector<double> value_sum(static_cast<size_t>(m) * value_dim, 0.0);
  std::vector<uint64_t> count_sum(m, 0);
  std::vector<int32_t> merged_into(m);
  std::iota(merged_into.begin(), merged_into.end(), 0);
  for (int32_t row = 0; row < m; ++row) {
    const double c = static_cast<double>(head->counts[row]);
    for (int32_t j = 0; j < key_dim; ++j) key_sum[static_cast<size_t>(row) * key_dim + j] =
        c * head->keys[static_cast<size_t>(row) * key_dim + j];
    for (int32_t j = 0; j < value_dim; ++j) value_sum[static_cast<size_t>(row) * value_dim + j] =
        c * head->values[static_cast<size_t>(row) * value_dim + j];
    count_sum[row] = head->counts[row];
  }
  for (const Edge& edge : kept) {
    const int32_t a = edge.source, b = edge.destination;
    const double c = static_cast<double>(head->counts[a]);
    for (int32_t j = 0; j < key_dim; ++j) {
      key_sum[static_cast<size_t>(b) * key_dim + j] += c * head->keys[static_cast<size_t>(a) * key_dim + j];
    }
    for (int32_t j = 0; j < value_dim; ++j) {
      value_sum[static_cast<size_t>(b) * value_dim + j] += c * head->values[static_cast<size_t>(a) * value_dim + j];
    }
    count_sum[b] += head->counts[a];
    merged_into[a] = b;
  }

  std::vector<int32_t> new_index(m, -1);
  HeadState next;
  next.owner = std::move(head->owner);
  for (int32_t row = 0; row < m; ++row) {
    if (merged_into[row] != row) continue;
    new_index[row] = next.length++;
    const double total = static_cast<double>(count_sum[row]);
    for (int32_t j = 0; j < key_dim; ++j) {
      // An untouched row keeps its exact value (protected entries stay bit-identical).
      next.keys.push_back(count_sum[row] == head->counts[row]
                              ? head->keys[static_cast<size_t>(row) * key_dim + j]
                              : key_sum[static_cast<size_t>(row) * key_dim + j] / total);
    }
    for (int32_t j = 0; j < value_dim; ++j) {
      next.values.push_back(count_sum[row] == head->counts[row]
                                ? head->values[static_cast<size_t>(row) * value_dim + j]
                                : value_sum[static_cast<size_t>(row) * value_dim + j] / total);
    }
    next.counts.push_back(count_sum[row]);
  }
  for (int32_t& owner : next.owner) owner = new_index[merged_into[owner]];
  *head = std::move(next);
}

void WriteResult(const LayerView& layer, const std::vector<HeadState>& heads,
                 bool with_assignment, CompressResult* out) {
  out->num_heads = layer.num_heads;
  out->num_tokens = layer.num_tokens;
  out->key_dim = layer.key_dim;
  out->value_dim = layer.value_dim;
  out->offsets.assign(1, 0);
  for (const HeadState& head : heads) {
    out->offsets.push_back(out->offsets.back() + head.length);
    for (double k : head.keys) out->keys.push_back(static_cast<float>(k));
    for (double v : head.values) out->values.push_back(static_cast<float>(v));
    for (uint64_t c : head.counts) out->counts.push_back(static_cast<uint32_t>(c));
    if (with_assignment) {
      out->assignment.insert(out->assignment.end(), head.owner.begin(), head.owner.end());
    }
  }
}

}  // namespace

absl::Status ReferenceEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                           const CompressControl& control,
                                           CompressResult* out) const {
  std::vector<HeadState> heads;
  heads.reserve(layer.num_heads);
  for (int32_t h = 0; h < layer.num_heads; ++h) heads.push_back(LoadHead(layer, h));

  const int64_t t = plan.target_length;
  for (int32_t pass = 0; pass < plan.options.max_passes; ++pass) {
    if (control.IsCancelled()) return absl::CancelledError("job cancelled");
    std::vector<std::vector<Edge>> candidates(layer.num_heads);
    std::vector<int64_t> merges(layer.num_heads, 0);
    bool any_long = false;
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      if (plan.passthrough[h] || heads[h].length <= t) continue;
      if (control.IsCancelled()) return absl::CancelledError("job cancelled");
      any_long = true;
      candidates[h] =
          CandidateEdges(heads[h], plan, layer.key_dim, plan.FloorForPass(pass), control);
      if (control.IsCancelled()) return absl::CancelledError("job cancelled");
      merges[h] = std::min<int64_t>(heads[h].length - t, candidates[h].size());
    }
    if (!any_long) break;
    if (plan.options.uniform_heads) {
      int64_t r = INT64_MAX;
      for (int32_t h = 0; h < layer.num_heads; ++h) {
        if (!plan.passthrough[h]) r = std::min(r, merges[h]);
      }
      for (int32_t h = 0; h < layer.num_heads; ++h) merges[h] = plan.passthrough[h] ? 0 : r;
    }
    bool merged_any = false;
    for (int32_t h = 0; h < layer.num_heads; ++h) {
      if (merges[h] <= 0) continue;
      if (control.IsCancelled()) return absl::CancelledError("job cancelled");
      KeepBest(&candidates[h], merges[h]);
      MergeAndCompact(&heads[h], candidates[h], layer.key_dim, layer.value_dim);
      merged_any = true;
    }
    if (!merged_any) break;
    out->passes_run = pass + 1;
  }
  WriteResult(layer, heads, plan.options.compute_assignment, out);
  return absl::OkStatus();
}

}  // namespace centroidkv
