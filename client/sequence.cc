// Sequence: the online plan (which positions become how many entries, in which version),
// its jobs per layer (submitted when their inputs are at hand), the result thread that turns
// results into splices, and CacheRows, the worker's map from rows to positions.
#include "centroidkv/client/sequence.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"

namespace centroidkv::client {

namespace {

// One planned job, the same for every layer: a new chunk (no inputs) or a re-merge of the
// results of `inputs` (adjacent regions, oldest first).
struct PlannedJob {
  uint64_t version = 0;
  int64_t first_position = 0;
  int64_t end_position = 0;
  int64_t target = 0;          // rows per head of its result
  std::vector<size_t> inputs;  // indices into the plan's jobs
  bool raw = false;            // a chunk kept as it is: no job, its rows are its "result"
};

// A merged region of the plan (oldest first): the result of job `job`.
struct Region {
  int64_t first_position = 0;
  int64_t end_position = 0;
  int64_t rows = 0;
  size_t job = 0;
};

enum class JobState { kWaiting, kInFlight, kDone, kReleased };

// One planned job of one layer: its input (owned while the job is in flight: the stream
// borrows it) and, once back, its result, kept while a later re-merge may need it.
struct LayerJobState {
  JobState state = JobState::kWaiting;
  std::vector<uint8_t> keys;
  std::vector<uint8_t> values;
  std::vector<uint32_t> counts;
  std::vector<int64_t> head_offsets;
  LayerJob job;
  std::shared_ptr<const Splice> result;  // once kDone
};

struct LayerState {
  // Uncompressed rows from position raw_first on, token-major: [tokens, H, d].
  int64_t raw_first = 0;
  std::deque<uint8_t> raw_keys;
  std::deque<uint8_t> raw_values;
  bool appended = false;            // this token's row is in
  std::vector<LayerJobState> jobs;  // by plan index
};

int64_t CeilRatio(double ratio, int64_t n) {
  const int64_t t = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n) - 1e-9));
  return std::clamp<int64_t>(t, 1, n);
}

}  // namespace

struct Sequence::State {
  Client* client = nullptr;
  SequenceOptions options;
  std::unique_ptr<CompressStream> stream;
  size_t key_row_bytes = 0;  // one token, every head
  size_t value_row_bytes = 0;

  mutable std::mutex mu;
  std::condition_variable changed;
  absl::Status status;
  bool cancelled = false;
  bool stopping = false;
  int64_t position = 0;
  int64_t next_chunk_first = 0;
  std::vector<PlannedJob> plan;
  std::vector<Region> regions;
  std::vector<LayerState> layers;
  std::map<uint64_t, std::pair<int32_t, size_t>> in_flight;  // stream job id -> (layer, job)
  std::vector<Splice> ready;
  SequenceStats stats;
  std::thread reader;

  int64_t MiddleCapacity() const {
    return options.budget_entries - options.sink_tokens -
           (options.recent_tokens + options.chunk_tokens - 1);
  }
  int64_t MiddleRows() const {
    int64_t rows = 0;
    for (const Region& r : regions) rows += r.rows;
    return rows;
  }

  void PlanJobsLocked();
  void PlanRemergesLocked();
  void StartReadyJobsLocked(int32_t layer);
  absl::Status SubmitLocked(int32_t layer, size_t job_index);
  void BuildChunkInputLocked(int32_t layer, size_t job_index);
  void KeepRawRegionLocked(int32_t layer, size_t job_index);
  void BuildRemergeInputLocked(int32_t layer, size_t job_index);
  void OnResultLocked(LayerResult result);
  void FailLocked(absl::Status error);
  void ReadResults();
  std::span<const float> LayerScales(const std::vector<float>& scales, int32_t layer) const;
  bool AllDoneLocked() const { return stats.jobs_in_flight == 0 && stats.jobs_waiting == 0; }
};

// ---------------------------------------------------------------------------------------
// Opening and checking.

namespace {

absl::Status CheckOptions(const SequenceOptions& o) {
  auto bad = [](const char* field, auto value, const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("SequenceOptions.", field, " = ", value, ": ", why));
  };
  if (o.num_layers < 1) return bad("num_layers", o.num_layers, "must be at least 1");
  if (o.num_heads < 1) return bad("num_heads", o.num_heads, "must be at least 1");
  if (o.key_dim < 1) return bad("key_dim", o.key_dim, "must be at least 1");
  if (o.value_dim < 1) return bad("value_dim", o.value_dim, "must be at least 1");
  if (o.sink_tokens < 0) return bad("sink_tokens", o.sink_tokens, "must not be negative");
  if (o.recent_tokens < 0) return bad("recent_tokens", o.recent_tokens, "must not be negative");
  if (o.chunk_tokens < 2) return bad("chunk_tokens", o.chunk_tokens, "must be at least 2");
  if (!(o.chunk_ratio > 0.0 && o.chunk_ratio <= 1.0)) {
    return bad("chunk_ratio", o.chunk_ratio, "must be in (0, 1]");
  }
  for (const auto& [field, scales] :
       {std::pair<const char*, const std::vector<float>*>{"key_scales", &o.key_scales},
        std::pair<const char*, const std::vector<float>*>{"value_scales", &o.value_scales}}) {
    if (!IsFp8(o.dtype)) {
      if (!scales->empty()) {
        return bad(field, scales->size(),
                   absl::StrCat("entries given for dtype ", std::string(DTypeName(o.dtype)),
                                ": scales are for fp8 caches only")
                       .c_str());
      }
      continue;
    }
    const size_t n = scales->size();
    const size_t layers = static_cast<size_t>(o.num_layers);
    if (n != 1 && n != layers && n != layers * static_cast<size_t>(o.num_heads)) {
      return bad(field, absl::StrCat(n, " entries"),
                 absl::StrCat("an fp8 cache needs 1, num_layers (", layers,
                              ") or num_layers x num_heads (", layers * o.num_heads, ")")
                     .c_str());
    }
    for (size_t i = 0; i < n; ++i) {
      if (!(std::isfinite((*scales)[i]) && (*scales)[i] > 0.0f)) {
        return bad(field, absl::StrCat("[", i, "] ", (*scales)[i]), "must be finite and > 0");
      }
    }
  }
  if (o.policy == OnlinePolicy::kFixedBudget) {
    const int64_t middle =
        o.budget_entries - o.sink_tokens - (o.recent_tokens + o.chunk_tokens - 1);
    if (middle < 2) {
      return bad("budget_entries", o.budget_entries,
                 absl::StrCat("leaves ", middle, " rows per head for merged regions after sinks (",
                              o.sink_tokens, ") and the recent window plus a chunk less one (",
                              o.recent_tokens + o.chunk_tokens - 1, "); at least 2 are needed")
                     .c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Sequence>> Sequence::Open(Client& client,
                                                         const SequenceOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->client = &client;
  state->options = options;
  const size_t element = static_cast<size_t>(DTypeSize(options.dtype));
  state->key_row_bytes = element * static_cast<size_t>(options.num_heads * options.key_dim);
  state->value_row_bytes = element * static_cast<size_t>(options.num_heads * options.value_dim);
  state->layers.resize(static_cast<size_t>(options.num_layers));
  state->next_chunk_first = options.sink_tokens;
  for (LayerState& layer : state->layers) layer.raw_first = options.sink_tokens;
  state->stream = client.OpenStream();
  if (state->stream == nullptr) return absl::UnavailableError("the client opened no stream");
  State* raw = state.get();
  state->reader = std::thread([raw] { raw->ReadResults(); });
  return std::unique_ptr<Sequence>(new Sequence(std::move(state)));
}

Sequence::Sequence(std::unique_ptr<State> state) : state_(std::move(state)) {}

Sequence::~Sequence() { Cancel(); }

const SequenceOptions& Sequence::options() const { return state_->options; }

absl::Status Sequence::status() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

SequenceStats Sequence::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  SequenceStats s = state_->stats;
  s.position = state_->position;
  s.planned_rows = state_->position;  // sinks, and positions not yet in a chunk
  if (state_->position > state_->options.sink_tokens) {
    s.planned_rows = state_->options.sink_tokens + state_->MiddleRows() +
                     (state_->position - state_->next_chunk_first);
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// Appending and planning.

absl::Status Sequence::Append(int32_t layer, const void* keys, const void* values) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stopping) return absl::CancelledError("the sequence was cancelled or closed");
  if (layer < 0 || layer >= s.options.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is not in [0, ", s.options.num_layers, ")"));
  }
  LayerState& l = s.layers[static_cast<size_t>(layer)];
  if (l.appended) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer ", layer, " already has position ", s.position, ": call EndToken()"));
  }
  l.appended = true;
  if (s.position < s.options.sink_tokens) return absl::OkStatus();  // sinks are never sent
  const auto* k = static_cast<const uint8_t*>(keys);
  const auto* v = static_cast<const uint8_t*>(values);
  l.raw_keys.insert(l.raw_keys.end(), k, k + s.key_row_bytes);
  l.raw_values.insert(l.raw_values.end(), v, v + s.value_row_bytes);
  return absl::OkStatus();
}

absl::Status Sequence::EndToken() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stopping) return absl::CancelledError("the sequence was cancelled or closed");
  for (int32_t layer = 0; layer < s.options.num_layers; ++layer) {
    if (!s.layers[static_cast<size_t>(layer)].appended) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, " has no row for position ", s.position));
    }
  }
  for (LayerState& l : s.layers) l.appended = false;
  ++s.position;
  if (!s.status.ok()) return s.status;  // a failed sequence compresses no more
  s.PlanJobsLocked();
  return s.status;
}

void Sequence::State::PlanJobsLocked() {
  const int64_t chunk = options.chunk_tokens;
  while (position - next_chunk_first >= options.recent_tokens + chunk) {
    const size_t first_new = plan.size();
    PlannedJob job;
    job.version = plan.size() + 1;
    job.first_position = next_chunk_first;
    job.end_position = next_chunk_first + chunk;
    // Under a budget a chunk stays as it is (a raw region: no job) until the budget needs
    // its room; at a fixed ratio it is merged at once.
    const bool raw = options.policy == OnlinePolicy::kFixedBudget;
    job.target = raw ? chunk : CeilRatio(options.chunk_ratio, chunk);
    job.raw = raw;
    plan.push_back(job);
    regions.push_back({job.first_position, job.end_position, job.target, first_new});
    next_chunk_first += chunk;
    if (options.policy == OnlinePolicy::kFixedBudget) PlanRemergesLocked();
    for (size_t j = first_new; j < plan.size(); ++j) {
      if (plan[j].raw) continue;
      ++stats.jobs_planned;
      if (!plan[j].inputs.empty()) ++stats.remerges_planned;
    }
    for (int32_t layer = 0; layer < options.num_layers; ++layer) {
      LayerState& l = layers[static_cast<size_t>(layer)];
      l.jobs.resize(plan.size());
      for (size_t j = first_new; j < plan.size(); ++j) {
        if (plan[j].inputs.empty()) BuildChunkInputLocked(layer, j);
        if (plan[j].raw) {
          KeepRawRegionLocked(layer, j);
        } else {
          ++stats.jobs_waiting;
        }
      }
      StartReadyJobsLocked(layer);
    }
  }
}

// While the merged regions exceed their room, the oldest region and the next one become one
// region of the size that fits (at least 1 row).
void Sequence::State::PlanRemergesLocked() {
  const int64_t capacity = MiddleCapacity();
  int64_t middle = MiddleRows();
  while (middle > capacity && !(regions.size() == 1 && regions[0].rows <= 1)) {
    const size_t take = regions.size() >= 2 ? 2 : 1;
    int64_t rows = 0;
    PlannedJob job;
    job.version = plan.size() + 1;
    job.first_position = regions[0].first_position;
    job.end_position = regions[take - 1].end_position;
    for (size_t i = 0; i < take; ++i) {
      rows += regions[i].rows;
      job.inputs.push_back(regions[i].job);
    }
    job.target = std::max<int64_t>(1, rows - (middle - capacity));
    regions.erase(regions.begin(), regions.begin() + static_cast<ptrdiff_t>(take));
    regions.insert(regions.begin(),
                   {job.first_position, job.end_position, job.target, plan.size()});
    middle += job.target - rows;
    plan.push_back(std::move(job));
  }
}

// ---------------------------------------------------------------------------------------
// Jobs of one layer.

void Sequence::State::BuildChunkInputLocked(int32_t layer, size_t job_index) {
  LayerState& l = layers[static_cast<size_t>(layer)];
  LayerJobState& js = l.jobs[job_index];
  const PlannedJob& job = plan[job_index];
  const int64_t tokens = job.end_position - job.first_position;
  const size_t element = static_cast<size_t>(DTypeSize(options.dtype));
  const size_t heads = static_cast<size_t>(options.num_heads);
  const size_t key_bytes = element * static_cast<size_t>(options.key_dim);
  const size_t value_bytes = element * static_cast<size_t>(options.value_dim);
  // The raw rows are token-major [tokens, H, d]; jobs go head-major [H, tokens, d].
  js.keys.resize(key_row_bytes * static_cast<size_t>(tokens));
  js.values.resize(value_row_bytes * static_cast<size_t>(tokens));
  const size_t skip = static_cast<size_t>(job.first_position - l.raw_first);
  for (size_t t = 0; t < static_cast<size_t>(tokens); ++t) {
    for (size_t h = 0; h < heads; ++h) {
      auto k =
          l.raw_keys.begin() + static_cast<ptrdiff_t>((skip + t) * key_row_bytes + h * key_bytes);
      std::copy(k, k + static_cast<ptrdiff_t>(key_bytes),
                js.keys.begin() +
                    static_cast<ptrdiff_t>((h * static_cast<size_t>(tokens) + t) * key_bytes));
      auto v = l.raw_values.begin() +
               static_cast<ptrdiff_t>((skip + t) * value_row_bytes + h * value_bytes);
      std::copy(v, v + static_cast<ptrdiff_t>(value_bytes),
                js.values.begin() +
                    static_cast<ptrdiff_t>((h * static_cast<size_t>(tokens) + t) * value_bytes));
    }
  }
  // Chunks are planned in position order: drop the rows up to this chunk's end.
  const size_t drop = skip + static_cast<size_t>(tokens);
  l.raw_keys.erase(l.raw_keys.begin(),
                   l.raw_keys.begin() + static_cast<ptrdiff_t>(drop * key_row_bytes));
  l.raw_values.erase(l.raw_values.begin(),
                     l.raw_values.begin() + static_cast<ptrdiff_t>(drop * value_row_bytes));
  l.raw_first = job.end_position;
  js.counts.assign(heads * static_cast<size_t>(tokens), 1u);
  js.job.layer.num_tokens = static_cast<int32_t>(tokens);
  js.job.layer.head_offsets = nullptr;
}

// A raw region's rows (its chunk input, head-major, counts 1) stand as its result.
void Sequence::State::KeepRawRegionLocked(int32_t layer, size_t job_index) {
  LayerJobState& js = layers[static_cast<size_t>(layer)].jobs[job_index];
  const PlannedJob& job = plan[job_index];
  auto rows = std::make_shared<Splice>();
  rows->layer = static_cast<uint32_t>(layer);
  rows->first_position = job.first_position;
  rows->end_position = job.end_position;
  rows->version = job.version;
  rows->dtype = options.dtype;
  rows->num_heads = options.num_heads;
  rows->rows_per_head = static_cast<int32_t>(job.end_position - job.first_position);
  rows->key_dim = options.key_dim;
  rows->value_dim = options.value_dim;
  rows->keys = std::move(js.keys);
  rows->values = std::move(js.values);
  rows->counts = std::move(js.counts);
  js.keys = {};
  js.values = {};
  js.counts = {};
  js.result = std::move(rows);
  js.state = JobState::kDone;
}

// The inputs' real rows (count > 0), head by head, oldest region first; ragged when the
// heads differ in length.
void Sequence::State::BuildRemergeInputLocked(int32_t layer, size_t job_index) {
  LayerState& l = layers[static_cast<size_t>(layer)];
  LayerJobState& js = l.jobs[job_index];
  const size_t element = static_cast<size_t>(DTypeSize(options.dtype));
  const size_t key_bytes = element * static_cast<size_t>(options.key_dim);
  const size_t value_bytes = element * static_cast<size_t>(options.value_dim);
  js.keys.clear();
  js.values.clear();
  js.counts.clear();
  js.head_offsets.assign(1, 0);
  int64_t longest = 0;
  bool ragged = false;
  for (int32_t h = 0; h < options.num_heads; ++h) {
    const size_t before = js.counts.size();
    for (size_t input : plan[job_index].inputs) {
      const Splice& part = *l.jobs[input].result;
      for (int32_t r = 0; r < part.rows_per_head; ++r) {
        const size_t row = static_cast<size_t>(h) * static_cast<size_t>(part.rows_per_head) +
                           static_cast<size_t>(r);
        if (part.counts[row] == 0) continue;
        js.counts.push_back(part.counts[row]);
        js.keys.insert(js.keys.end(), part.keys.begin() + static_cast<ptrdiff_t>(row * key_bytes),
                       part.keys.begin() + static_cast<ptrdiff_t>((row + 1) * key_bytes));
        js.values.insert(js.values.end(),
                         part.values.begin() + static_cast<ptrdiff_t>(row * value_bytes),
                         part.values.begin() + static_cast<ptrdiff_t>((row + 1) * value_bytes));
      }
    }
    const int64_t length = static_cast<int64_t>(js.counts.size() - before);
    if (h > 0 && length != longest) ragged = true;
    longest = std::max(longest, length);
    js.head_offsets.push_back(static_cast<int64_t>(js.counts.size()));
  }
  js.job.layer.num_tokens = static_cast<int32_t>(longest);
  js.job.layer.head_offsets = ragged ? js.head_offsets.data() : nullptr;
  // The inputs are superseded once this job is planned: keep nothing older.
  for (size_t input : plan[job_index].inputs) {
    l.jobs[input].result.reset();
    l.jobs[input].state = JobState::kReleased;
  }
}

void Sequence::State::StartReadyJobsLocked(int32_t layer) {
  LayerState& l = layers[static_cast<size_t>(layer)];
  for (size_t j = 0; j < l.jobs.size() && status.ok(); ++j) {
    if (l.jobs[j].state != JobState::kWaiting) continue;
    const PlannedJob& job = plan[j];
    const bool inputs_back = std::all_of(job.inputs.begin(), job.inputs.end(), [&](size_t i) {
      return l.jobs[i].state == JobState::kDone;
    });
    if (!inputs_back) continue;
    if (!job.inputs.empty()) BuildRemergeInputLocked(layer, j);
    if (absl::Status s = SubmitLocked(layer, j); !s.ok()) FailLocked(s);
  }
}

// The scales of `layer` in SequenceOptions::key_scales / value_scales: one for every head
// (one entry, or one per layer) or one per KV head.
std::span<const float> Sequence::State::LayerScales(const std::vector<float>& scales,
                                          int32_t layer) const {
  if (scales.size() == 1) return {scales.data(), 1};
  if (scales.size() == static_cast<size_t>(options.num_layers)) {
    return {scales.data() + layer, 1};
  }
  const auto heads = static_cast<size_t>(options.num_heads);
  return {scales.data() + static_cast<size_t>(layer) * heads, heads};
}

absl::Status Sequence::State::SubmitLocked(int32_t layer, size_t job_index) {
  LayerJobState& js = layers[static_cast<size_t>(layer)].jobs[job_index];
  LayerJob& job = js.job;
  job.layer_index = static_cast<uint32_t>(layer);
  job.layer.dtype = options.dtype;
  job.layer.layout = TensorLayout::kHeadMajor;
  job.layer.num_heads = options.num_heads;
  job.layer.key_dim = options.key_dim;
  job.layer.value_dim = options.value_dim;
  job.layer.keys = js.keys.data();
  job.layer.values = js.values.data();
  job.layer.counts = js.counts.data();
  job.options = options.compression;
  job.options.target_ratio.reset();
  job.options.target_tokens = plan[job_index].target;
  job.options.sink_tokens = 0;
  job.options.recent_tokens = 0;
  job.options.exact_target = true;
  job.options.pad_heads = true;
  job.options.pad_to = 0;
  job.options.output_layout = TensorLayout::kHeadMajor;
  job.options.compute_assignment = false;
  job.options.result_dtype = DType::kFloat32;
  job.output_dtype = options.dtype;
  if (IsFp8(options.dtype)) {  // in and out in the cache's scales (static)
    job.layer.key_scales = LayerScales(options.key_scales, layer);
    job.layer.value_scales = LayerScales(options.value_scales, layer);
    job.options.result_key_scales.assign(job.layer.key_scales.begin(),
                                         job.layer.key_scales.end());
    job.options.result_value_scales.assign(job.layer.value_scales.begin(),
                                           job.layer.value_scales.end());
  }
  job.backend = options.backend;
  job.priority = options.priority;
  absl::StatusOr<uint64_t> id = stream->Submit(job);
  if (!id.ok()) return id.status();
  js.state = JobState::kInFlight;
  in_flight[*id] = {layer, job_index};
  --stats.jobs_waiting;
  ++stats.jobs_in_flight;
  ++stats.jobs_submitted;
  changed.notify_all();
  return absl::OkStatus();
}

void Sequence::State::FailLocked(absl::Status error) {
  if (status.ok()) status = std::move(error);
  changed.notify_all();
}

// ---------------------------------------------------------------------------------------
// Results.

void Sequence::State::OnResultLocked(LayerResult result) {
  auto it = in_flight.find(result.job_id);
  if (it == in_flight.end()) return;  // not ours any more (cancelled)
  const auto [layer, job_index] = it->second;
  in_flight.erase(it);
  --stats.jobs_in_flight;
  LayerJobState& js = layers[static_cast<size_t>(layer)].jobs[job_index];
  js.keys = {};  // the stream no longer reads the input
  js.values = {};
  js.counts = {};
  js.head_offsets = {};
  if (!result.status.ok()) {
    js.state = JobState::kReleased;
    FailLocked(absl::Status(
        result.status.code(),
        absl::StrCat("layer ", layer, " positions [", plan[job_index].first_position, ", ",
                     plan[job_index].end_position, "): ", result.status.message())));
    return;
  }
  const int32_t heads = options.num_heads;
  if (result.num_heads != heads || static_cast<int32_t>(result.offsets.size()) != heads + 1 ||
      result.dtype != options.dtype) {
    FailLocked(absl::InternalError(absl::StrCat("layer ", layer, ": a result of ", result.num_heads,
                                                " heads in another shape or dtype")));
    return;
  }
  if (IsFp8(options.dtype)) {
    const std::span<const float> keys = LayerScales(options.key_scales, layer);
    const std::span<const float> values = LayerScales(options.value_scales, layer);
    for (int32_t h = 0; h < heads; ++h) {
      const size_t key = keys.size() == 1 ? 0 : static_cast<size_t>(h);
      const size_t value = values.size() == 1 ? 0 : static_cast<size_t>(h);
      if (result.key_scales.size() != static_cast<size_t>(heads) ||
          result.value_scales.size() != static_cast<size_t>(heads) ||
          result.key_scales[h] != keys[key] || result.value_scales[h] != values[value]) {
        FailLocked(absl::InternalError(absl::StrCat(
            "layer ", layer, ": fp8 rows came back in other scales than the cache's")));
        return;
      }
    }
  }
  const int64_t rows = result.offsets[1] - result.offsets[0];
  for (int32_t h = 0; h < heads; ++h) {
    if (result.offsets[h + 1] - result.offsets[h] != rows) {
      FailLocked(absl::InternalError(
          absl::StrCat("layer ", layer, ": result heads differ in rows despite pad_heads")));
      return;
    }
  }
  auto splice = std::make_shared<Splice>();
  splice->layer = static_cast<uint32_t>(layer);
  splice->first_position = plan[job_index].first_position;
  splice->end_position = plan[job_index].end_position;
  splice->version = plan[job_index].version;
  splice->dtype = options.dtype;
  splice->num_heads = heads;
  splice->rows_per_head = static_cast<int32_t>(rows);
  splice->key_dim = options.key_dim;
  splice->value_dim = options.value_dim;
  splice->keys = std::move(result.keys);
  splice->values = std::move(result.values);
  splice->counts = std::move(result.counts);
  ready.push_back(*splice);
  if (js.state == JobState::kInFlight) {
    js.state = JobState::kDone;
    js.result = std::move(splice);
  }
  StartReadyJobsLocked(layer);
  changed.notify_all();
}

void Sequence::State::ReadResults() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      changed.wait(lock, [this] { return stopping || !in_flight.empty(); });
      if (stopping) return;
    }
    absl::StatusOr<LayerResult> result = stream->Next();
    if (!result.ok() && result.status().code() == absl::StatusCode::kOutOfRange) {
      // The stream has nothing unanswered although a job is recorded in flight: a result
      // can only follow a Submit, so wait for it rather than spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return;
    if (result.ok()) {
      OnResultLocked(*std::move(result));
    } else {
      // The stream broke (a ReplicaPool resends what it can before saying so): the jobs in
      // flight are lost, the rows they would have replaced stay uncompressed.
      FailLocked(result.status());
      stats.jobs_in_flight -= static_cast<int64_t>(in_flight.size());
      in_flight.clear();
      changed.notify_all();
      return;
    }
  }
}

std::vector<Splice> Sequence::TakeSplices() {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<Splice> out = std::move(state_->ready);
  state_->ready.clear();
  state_->stats.splices_returned += static_cast<int64_t>(out.size());
  return out;
}

absl::Status Sequence::Flush() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.changed.wait(lock, [&s] { return s.cancelled || !s.status.ok() || s.AllDoneLocked(); });
  if (s.cancelled) return absl::CancelledError("the sequence was cancelled");
  return s.status;
}

absl::Status Sequence::Close() {
  State& s = *state_;
  absl::Status flushed = Flush();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping)
      return flushed.ok() ? absl::CancelledError("the sequence was cancelled") : flushed;
    if (!flushed.ok()) {
      // Jobs may still be in flight: cancel them rather than wait.
    } else {
      s.stopping = true;
      s.changed.notify_all();
    }
  }
  if (!flushed.ok()) {
    Cancel();
    return flushed;
  }
  if (s.reader.joinable()) s.reader.join();
  absl::Status closed = s.stream->Close();
  s.stream.reset();
  return closed;
}

void Sequence::Cancel() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping) return;
    s.cancelled = true;
    s.stopping = true;
    s.changed.notify_all();
  }
  // Abort makes a blocked Next() return; the server drops every job of the stream.
  if (s.stream != nullptr) s.stream->Abort();
  if (s.reader.joinable()) s.reader.join();
  s.stream.reset();  // the stream reads no job input after this
  std::lock_guard<std::mutex> lock(s.mu);
  s.in_flight.clear();
  s.stats.jobs_in_flight = 0;
  s.ready.clear();
}

// ---------------------------------------------------------------------------------------
// CacheRows.

CacheRows::CacheRows(int32_t num_layers) : layers_(static_cast<size_t>(std::max(num_layers, 0))) {}

void CacheRows::AppendToken() {
  for (std::vector<Run>& runs : layers_) {
    if (!runs.empty() && runs.back().version == 0 && runs.back().end_position == position_) {
      ++runs.back().end_position;
      ++runs.back().rows;
    } else {
      runs.push_back({position_, position_ + 1, 0, 1});
    }
  }
  ++position_;
}

int64_t CacheRows::rows(int32_t layer) const {
  int64_t total = 0;
  for (const Run& run : layers_.at(static_cast<size_t>(layer))) total += run.rows;
  return total;
}

absl::StatusOr<std::optional<SpliceRows>> CacheRows::Place(const Splice& splice) {
  if (splice.layer >= layers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("splice.layer ", splice.layer, " is not in [0, ", layers_.size(), ")"));
  }
  const int64_t first = splice.first_position;
  const int64_t end = splice.end_position;
  if (first < 0 || end <= first || end > position_) {
    return absl::FailedPreconditionError(absl::StrCat("splice positions [", first, ", ", end,
                                                      ") are not within the ", position_,
                                                      " positions appended"));
  }
  std::vector<Run>& runs = layers_[splice.layer];
  // Stale when rows of a newer splice cover any of its positions.
  for (const Run& run : runs) {
    if (run.end_position > first && run.first_position < end && run.version >= splice.version) {
      return std::optional<SpliceRows>();
    }
  }
  // Uncompressed runs are cut at the splice's edges (one row per position).
  for (size_t i = 0; i < runs.size(); ++i) {
    for (int64_t edge : {first, end}) {
      Run& run = runs[i];
      if (run.version == 0 && run.first_position < edge && edge < run.end_position) {
        Run tail = {edge, run.end_position, 0, run.end_position - edge};
        run.end_position = edge;
        run.rows = edge - run.first_position;
        runs.insert(runs.begin() + static_cast<ptrdiff_t>(i) + 1, tail);
      }
    }
  }
  size_t begin = 0;
  int64_t row_begin = 0;
  while (begin < runs.size() && runs[begin].end_position <= first) {
    row_begin += runs[begin].rows;
    ++begin;
  }
  size_t stop = begin;
  int64_t row_end = row_begin;
  while (stop < runs.size() && runs[stop].first_position < end) {
    if (runs[stop].first_position < first || runs[stop].end_position > end) {
      return absl::FailedPreconditionError(
          absl::StrCat("splice version ", splice.version, " for positions [", first, ", ", end,
                       ") cuts through the rows of version ", runs[stop].version, " for [",
                       runs[stop].first_position, ", ", runs[stop].end_position, ")"));
    }
    row_end += runs[stop].rows;
    ++stop;
  }
  runs.erase(runs.begin() + static_cast<ptrdiff_t>(begin),
             runs.begin() + static_cast<ptrdiff_t>(stop));
  runs.insert(runs.begin() + static_cast<ptrdiff_t>(begin),
              Run{first, end, splice.version, splice.rows_per_head});
  return std::optional<SpliceRows>(SpliceRows{row_begin, row_end});
}

}  // namespace centroidkv::client
