// LayerBatch: batching rules, workspace layout, input staging and result extraction.
#include "kernels/cuda/layer_batch.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "oneapi/tbb/parallel_for.h"
#include "kernels/cuda/tile_match.h"

namespace centroidkv::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Hands out aligned sub-blocks of one block (or, with base == nullptr, only sums sizes).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    char* at = base_ == nullptr ? nullptr : base_ + used_;
    used_ += AlignUp(sizeof(T) * static_cast<size_t>(count));
    return reinterpret_cast<T*>(at);
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

void CarveInput(const BatchParams& p, Carver& c, BatchArrays& a) {
  const int64_t rows = p.global_heads() * p.num_tokens;
  const int64_t elem = p.input_type == kInputF32 ? 4 : 2;
  a.keys_in = c.Take<char>(rows * p.key_dim * elem);
  a.values_in = c.Take<char>(rows * p.value_dim * elem);
  a.counts_in = c.Take<uint32_t>(rows);
  a.passthrough = c.Take<uint8_t>(p.global_heads());
}

void CarveWork(const BatchParams& p, bool with_state, Carver& c, BatchArrays& a) {
  const int64_t g = p.global_heads(), rows = g * p.num_tokens, slots = g * p.slot_capacity;
  const int64_t state_rows = with_state ? rows : 0;
  for (int k = 0; k < 2; ++k) {
    a.state_keys[k] = c.Take<double>(state_rows * p.key_dim);
    a.state_values[k] = c.Take<double>(state_rows * p.value_dim);
    a.state_counts[k] = c.Take<uint64_t>(state_rows);
  }
  const bool tiles = p.match_tiles != 0;
  a.norm_keys = c.Take<float>(tiles ? 0 : rows * p.key_dim);
  a.match_count = c.Take<int32_t>(tiles ? slots : 0);
  a.match_ties = c.Take<int32_t>(tiles ? slots * kMaxTies : 0);
  a.head_cur = c.Take<int32_t>(g);
  a.head_active = c.Take<int32_t>(g);
  a.head_slots = c.Take<int32_t>(g);
  a.head_candidates = c.Take<int32_t>(g);
  a.head_merges = c.Take<int32_t>(g);
  a.seg_begin = c.Take<int32_t>(g);
  a.seg_end = c.Take<int32_t>(g);
  a.job_done = c.Take<int32_t>(p.num_jobs);
  a.job_output_written = c.Take<int32_t>(p.num_jobs);
  a.edge_dest = c.Take<int32_t>(slots);
  a.edge_score = c.Take<double>(slots);
  a.edge_kept = c.Take<uint8_t>(slots);
  a.sort_keys_in = c.Take<uint64_t>(slots);
  a.sort_values_in = c.Take<int32_t>(slots);
  a.sort_keys_out = c.Take<uint64_t>(slots);
  a.sort_values_out = c.Take<int32_t>(slots);
  a.bucket_next = c.Take<int32_t>(slots);
  a.index_blocks = c.Take<int32_t>(g * IndexBlocks(p));
  a.new_index = c.Take<int32_t>(rows);
  a.bucket_head = c.Take<int32_t>(rows);
}

void CarveSmallOut(const BatchParams& p, Carver& c, BatchArrays& a) {
  a.head_length = c.Take<int32_t>(p.global_heads());
  a.out_offsets = c.Take<int64_t>(p.global_heads() + 1);
  a.job_passes = c.Take<int32_t>(p.num_jobs);
}

int64_t ResultElementBytes(const BatchParams& p) {
  return DTypeSize(static_cast<DType>(p.result_type));
}

void CarvePacked(const BatchParams& p, Carver& c, BatchArrays& a) {
  const int64_t rows = p.global_heads() * p.num_tokens;
  a.packed_keys = c.Take<char>(rows * p.key_dim * ResultElementBytes(p));
  a.packed_values = c.Take<char>(rows * p.value_dim * ResultElementBytes(p));
  a.packed_counts = c.Take<uint32_t>(rows);
}

// Copies on all cores, in pieces of 4 MiB: staging into pinned memory is the host side of
// every upload, and one thread copies far below the link's rate.
struct Copy {
  void* to;
  const void* from;
  size_t bytes;
};
void ParallelCopy(const std::vector<Copy>& copies) {
  constexpr size_t kPiece = size_t{4} << 20;
  std::vector<Copy> pieces;
  for (const Copy& c : copies) {
    for (size_t at = 0; at < c.bytes; at += kPiece) {
      pieces.push_back({static_cast<char*>(c.to) + at, static_cast<const char*>(c.from) + at,
                        std::min(kPiece, c.bytes - at)});
    }
  }
  tbb::parallel_for(size_t{0}, pieces.size(), [&](size_t i) {
    std::memcpy(pieces[i].to, pieces[i].from, pieces[i].bytes);
  });
}

bool SameOptions(const CompressOptions& a, const CompressOptions& b) {
  return a.chunk_size == b.chunk_size && a.sink_tokens == b.sink_tokens &&
         a.recent_tokens == b.recent_tokens && a.min_similarity == b.min_similarity &&
         a.tighten_per_pass == b.tighten_per_pass && a.max_passes == b.max_passes &&
         a.uniform_heads == b.uniform_heads && a.result_dtype == b.result_dtype;
}

// The last pass that merges anything when every candidate is kept (no floor): every
// compressed head has the same length in every pass (SPEC.md section 2 steps 1-5).
int32_t LastPassWithoutFloor(const BatchParams& p) {
  int64_t length = p.num_tokens;
  int32_t last = -1;
  for (int32_t pass = 0; pass < p.max_passes && length > p.target; ++pass) {
    const int64_t edges = SlotsInRange(length - p.sink - p.recent, p.chunk);
    const int64_t merges = std::min(length - p.target, edges);
    if (merges <= 0) break;
    length -= merges;
    last = pass;
  }
  return last;
}

}  // namespace

bool CanBatch(const BatchJob& a, const BatchJob& b) {
  const LayerView& x = *a.layer;
  const LayerView& y = *b.layer;
  return x.dtype == y.dtype && x.layout == y.layout && x.num_heads == y.num_heads &&
         x.num_tokens == y.num_tokens && x.key_dim == y.key_dim && x.value_dim == y.value_dim &&
         a.plan->target_length == b.plan->target_length &&
         a.plan->passthrough == b.plan->passthrough &&
         SameOptions(a.plan->options, b.plan->options);
}

absl::StatusOr<LayerBatch> LayerBatch::Create(std::span<const BatchJob> jobs, MatchKernel match) {
  if (jobs.empty()) return absl::InvalidArgumentError("LayerBatch: no jobs");
  for (const BatchJob& job : jobs) {
    if (!CanBatch(jobs[0], job)) return absl::InvalidArgumentError("LayerBatch: jobs differ");
  }
  const LayerView& layer = *jobs[0].layer;
  const LayerPlan& plan = *jobs[0].plan;
  LayerBatch batch;
  batch.jobs_.assign(jobs.begin(), jobs.end());
  BatchParams& p = batch.params_;
  p.num_jobs = static_cast<int32_t>(jobs.size());
  p.heads = layer.num_heads;
  p.num_tokens = layer.num_tokens;
  p.key_dim = layer.key_dim;
  p.value_dim = layer.value_dim;
  p.input_type = static_cast<int32_t>(layer.dtype);
  p.token_major = layer.layout == TensorLayout::kTokenMajor ? 1 : 0;
  p.result_type = static_cast<int32_t>(plan.options.result_dtype);
  p.chunk = plan.options.chunk_size;
  p.sink = plan.options.sink_tokens;
  p.recent = plan.options.recent_tokens;
  p.uniform = plan.options.uniform_heads ? 1 : 0;
  p.max_passes = plan.options.max_passes;
  p.target = plan.target_length;
  p.slot_capacity = static_cast<int64_t>(layer.num_tokens) + 2;
  p.match_tiles = match == MatchKernel::kTiles && TileMatchSupports(layer.key_dim) ? 1 : 0;
  p.bound = p.match_tiles != 0 ? TileMatchBound(layer.key_dim) : MatchBound(layer.key_dim);
  if (p.global_heads() * p.slot_capacity >= std::numeric_limits<int32_t>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda: a batch of ", p.global_heads(), " heads x ", p.num_tokens,
        " tokens exceeds the 2^31 source slots one launch indexes"));
  }
  batch.floor_on_ = plan.options.min_similarity.has_value() ? 1 : 0;
  for (int32_t pass = 0; pass < p.max_passes; ++pass) {
    batch.floors_.push_back(plan.FloorForPass(pass));
  }
  if (plan.compressed_heads == 0) {
    batch.last_pass_ = -1;
  } else if (batch.floor_on_ != 0) {
    batch.last_pass_ = p.max_passes - 1;
  } else {
    batch.last_pass_ = LastPassWithoutFloor(p);
  }
  BatchArrays ignored{};
  Carver input(nullptr), work(nullptr), small_out(nullptr), owner(nullptr), packed(nullptr);
  CarveInput(p, input, ignored);
  CarveWork(p, batch.last_pass_ > 0, work, ignored);
  CarveSmallOut(p, small_out, ignored);
  owner.Take<int32_t>(batch.rows());
  CarvePacked(p, packed, ignored);
  batch.sizes_ = {input.used(), work.used(), small_out.used(), owner.used(), packed.used()};
  return batch;
}

PassArgs LayerBatch::Pass(int32_t pass) const {
  PassArgs args;
  args.pass = pass;
  args.floor_on = floor_on_;
  args.floor = floor_on_ != 0 ? floors_[pass] : 0.0;
  args.sink_output = pass == last_pass_ ? 1 : 0;
  return args;
}

int64_t LayerBatch::Items(StageId stage) const {
  switch (stage) {
    case StageId::kSetup:
    case StageId::kIndexPrefix:
    case StageId::kFinish:
      return params_.global_heads();
    case StageId::kIndexCount:
    case StageId::kIndex:
      return params_.global_heads() * IndexBlocks(params_);
    case StageId::kSelect:
      return params_.num_jobs;
    case StageId::kMatch:
    case StageId::kMarkKept:
      return slots();
    case StageId::kMatchTiles:
      return TileMatchItems(params_);
    case StageId::kBucket:
      return params_.global_heads() * ChunksPerHead(params_);
    case StageId::kOffsets:
      return 1;
    default:
      return rows();
  }
}

BatchArrays LayerBatch::Carve(void* input, void* work, void* small_out, void* owner,
                              void* packed) const {
  BatchArrays a{};
  Carver in(input), wk(work), so(small_out), ow(owner), pk(packed);
  CarveInput(params_, in, a);
  CarveWork(params_, last_pass_ > 0, wk, a);
  CarveSmallOut(params_, so, a);
  a.owner = ow.Take<int32_t>(rows());
  CarvePacked(params_, pk, a);
  return a;
}

void LayerBatch::StageInputs(void* input) const {
  const BatchParams& p = params_;
  BatchArrays a{};
  Carver carver(input);
  CarveInput(p, carver, a);
  const int64_t per_job_rows = static_cast<int64_t>(p.heads) * p.num_tokens;
  const auto elem = static_cast<size_t>(p.input_type == kInputF32 ? 4 : 2);
  std::vector<Copy> copies;
  for (int32_t j = 0; j < p.num_jobs; ++j) {
    const LayerView& layer = *jobs_[j].layer;
    const size_t key_bytes = static_cast<size_t>(per_job_rows) * p.key_dim * elem;
    const size_t value_bytes = static_cast<size_t>(per_job_rows) * p.value_dim * elem;
    copies.push_back({static_cast<char*>(const_cast<void*>(a.keys_in)) + j * key_bytes,
                      layer.keys, key_bytes});
    copies.push_back({static_cast<char*>(const_cast<void*>(a.values_in)) + j * value_bytes,
                      layer.values, value_bytes});
    uint32_t* counts = const_cast<uint32_t*>(a.counts_in) + j * per_job_rows;
    if (layer.counts != nullptr) {
      copies.push_back({counts, layer.counts, sizeof(uint32_t) * per_job_rows});
    } else {
      std::fill(counts, counts + per_job_rows, 1u);
    }
    uint8_t* passthrough = const_cast<uint8_t*>(a.passthrough) + static_cast<int64_t>(j) * p.heads;
    for (int32_t h = 0; h < p.heads; ++h) passthrough[h] = jobs_[j].plan->passthrough[h] ? 1 : 0;
  }
  ParallelCopy(copies);
}

int64_t LayerBatch::PackedRows(const void* small_out) const {
  BatchArrays a{};
  Carver carver(const_cast<void*>(small_out));
  CarveSmallOut(params_, carver, a);
  return a.out_offsets[params_.global_heads()];
}

std::vector<std::pair<size_t, size_t>> LayerBatch::PackedRanges(int64_t rows) const {
  BatchArrays a{};
  char* const base = reinterpret_cast<char*>(kAlign);  // any non-null base: offsets only
  Carver carver(base);
  CarvePacked(params_, carver, a);
  auto range = [&](const void* at, size_t bytes) {
    return std::make_pair(static_cast<size_t>(static_cast<const char*>(at) - base), bytes);
  };
  const auto element = static_cast<size_t>(ResultElementBytes(params_));
  return {range(a.packed_keys, element * rows * params_.key_dim),
          range(a.packed_values, element * rows * params_.value_dim),
          range(a.packed_counts, sizeof(uint32_t) * rows)};
}

void LayerBatch::ExtractResults(const void* small_out, const int32_t* owner,
                                const void* packed) const {
  const BatchParams& p = params_;
  BatchArrays a{};
  Carver so(const_cast<void*>(small_out)), pk(const_cast<void*>(packed));
  CarveSmallOut(p, so, a);
  CarvePacked(p, pk, a);
  // The packed arrays were carved for G * n rows; the download filled the first rows only.
  // Jobs in parallel (each result's vectors are filled by one thread).
  tbb::parallel_for(int32_t{0}, p.num_jobs, [&](int32_t j) {
    CompressResult& out = *jobs_[j].out;
    const int64_t first_head = static_cast<int64_t>(j) * p.heads;
    const int64_t base = a.out_offsets[first_head];
    const int64_t end = a.out_offsets[first_head + p.heads];
    out.num_heads = p.heads;
    out.num_tokens = p.num_tokens;
    out.key_dim = p.key_dim;
    out.value_dim = p.value_dim;
    out.offsets.resize(static_cast<size_t>(p.heads) + 1);
    for (int32_t h = 0; h <= p.heads; ++h) out.offsets[h] = a.out_offsets[first_head + h] - base;
    out.dtype = static_cast<DType>(p.result_type);
    if (p.result_type == kInputF32) {
      const auto* keys = static_cast<const float*>(a.packed_keys);
      const auto* values = static_cast<const float*>(a.packed_values);
      out.keys.assign(keys + base * p.key_dim, keys + end * p.key_dim);
      out.values.assign(values + base * p.value_dim, values + end * p.value_dim);
    } else {
      const auto* keys = static_cast<const uint16_t*>(a.packed_keys);
      const auto* values = static_cast<const uint16_t*>(a.packed_values);
      out.half_keys.assign(keys + base * p.key_dim, keys + end * p.key_dim);
      out.half_values.assign(values + base * p.value_dim, values + end * p.value_dim);
    }
    out.counts.assign(a.packed_counts + base, a.packed_counts + end);
    if (jobs_[j].plan->options.compute_assignment) {
      const int32_t* first = owner + first_head * p.num_tokens;
      out.assignment.assign(first, first + static_cast<int64_t>(p.heads) * p.num_tokens);
    }
    out.passes_run = a.job_passes[j];
  });
}

}  // namespace centroidkv::cuda
