// LayerJob, pass control: the job's per-head state, the pass loop (SPEC.md section 2 steps
// 1-2, 5-6 and 8: each pass's floor, which heads take part, how many merges each makes, and
// why the passes stop: no head over the target, no merges, the pass limit, cancellation or
// bad input), where each pass writes its rows, and the chunk tasks it runs over oneTBB.
// Matching and merging one chunk is in layer_job_chunks.cc; the result arrays and rows in
// layer_job_output.cc.
#include "kernels/cpu/layer_job.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"

namespace centroidkv::cpu {
namespace {

ElemType ElemTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return ElemType::kF16;
    case DType::kBFloat16:
      return ElemType::kBF16;
    case DType::kFp8E4M3:
      return ElemType::kE4M3;
    case DType::kFp8E5M2:
      return ElemType::kE5M2;
    case DType::kFloat32:
      break;
  }
  return ElemType::kF32;
}

}  // namespace

void LayerJob::Head::Reset() {
  index = 0;
  passthrough = false;
  length = 0;
  owned = false;
  keys.clear();
  values.clear();
  owner.clear();  // empty means the identity
  written = false;
  active = false;
  begin = end = 0;
  num_chunks = 0;
  candidates = merges = 0;
  sink = Sink::kOutput;
  chunk_start.clear();
  order.clear();
  // counts, next_counts, remap and edges keep their size and stale contents: a job writes
  // every element it reads (LoadHeads, WriteCount, MergeChunk and WriteProtectedRows,
  // MatchChunk), so resizing them to the same size again costs nothing rather than
  // value-initialising megabytes per job.
}

std::vector<LayerJob::Head> HeadPool::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return {};
  std::vector<LayerJob::Head> heads = std::move(free_.back());
  free_.pop_back();
  return heads;
}

void HeadPool::Give(std::vector<LayerJob::Head> heads) {
  for (LayerJob::Head& head : heads) {
    head.Reset();
    RowStore().swap(head.keys);
    RowStore().swap(head.values);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < kMaxKept) free_.push_back(std::move(heads));
}

LayerJob::LayerJob(const KernelTable& kernels, ScratchPool* scratch, const LayerPlan& plan,
                   const LayerView& layer, const CompressControl& control, CompressResult* out,
                   HeadPool* heads)
    : kernels_(kernels),
      scratch_(scratch),
      head_pool_(heads),
      plan_(plan),
      layer_(layer),
      control_(control),
      stop_{[](const void* context) {
              return static_cast<const CompressControl*>(context)->IsCancelled();
            },
            &control},
      out_(out),
      input_type_(ElemTypeOf(layer.dtype)),
      input_element_bytes_(DTypeSize(layer.dtype)),
      key_stride_(layer.layout == TensorLayout::kHeadMajor
                      ? int64_t{layer.key_dim}
                      : int64_t{layer.key_dim} * layer.num_heads),
      value_stride_(layer.layout == TensorLayout::kHeadMajor
                        ? int64_t{layer.value_dim}
                        : int64_t{layer.value_dim} * layer.num_heads),
      key_dim_(layer.key_dim),
      value_dim_(layer.value_dim),
      chunk_size_(plan.options.chunk_size),
      slots_((plan.options.chunk_size + 1) / 2),
      target_(plan.target_length),
      bound_(MatchErrorBound(kernels, layer.key_dim, plan.options.chunk_size)),
      with_assignment_(plan.options.compute_assignment),
      output_type_(ElemTypeOf(plan.options.result_dtype)),
      fp8_staged_(IsFp8Elem(output_type_) && (plan.options.result_key_scales.empty() ||
                                              plan.options.result_value_scales.empty())),
      row_max_bits_(fp8_staged_ ? new std::atomic<uint32_t>[2 * layer.num_heads] : nullptr) {
  if (head_pool_ != nullptr) heads_ = head_pool_->Take();
}

LayerJob::~LayerJob() {
  if (head_pool_ != nullptr) head_pool_->Give(std::move(heads_));
}

RowBlock ShiftRows(const RowBlock& rows, int64_t first) {
  RowBlock shifted = rows;
  shifted.data =
      static_cast<const char*>(rows.data) + first * rows.stride * ElemTypeBytes(rows.type);
  return shifted;
}

RowBlock LayerJob::InputKeys(const Head& head) const {
  const char* base = static_cast<const char*>(layer_.keys) +
                     layer_.KeyOffset(head.index, 0) * input_element_bytes_;
  const float scale = IsFp8Elem(input_type_) ? layer_.KeyScale(head.index) : 1.0f;
  return RowBlock{base, input_type_, key_stride_, scale};
}

RowBlock LayerJob::InputValues(const Head& head) const {
  const char* base = static_cast<const char*>(layer_.values) +
                     layer_.ValueOffset(head.index, 0) * input_element_bytes_;
  const float scale = IsFp8Elem(input_type_) ? layer_.ValueScale(head.index) : 1.0f;
  return RowBlock{base, input_type_, value_stride_, scale};
}

RowBlock LayerJob::Keys(const Head& head) const {
  if (head.owned) return RowBlock{head.keys.data(), ElemType::kF64, key_dim_};
  return InputKeys(head);
}

RowBlock LayerJob::Values(const Head& head) const {
  if (head.owned) return RowBlock{head.values.data(), ElemType::kF64, value_dim_};
  return InputValues(head);
}

// Head row r of the recent window is input row r + (n - length): nothing before it merged.
RowBlock LayerJob::RecentKeys(const Head& head) const {
  return ShiftRows(InputKeys(head), layer_.num_tokens - head.length);
}

RowBlock LayerJob::RecentValues(const Head& head) const {
  return ShiftRows(InputValues(head), layer_.num_tokens - head.length);
}

ExactScorer LayerJob::Scorer(const Head& head) const {
  return ExactScorer(kernels_, Keys(head), key_dim_);
}

int32_t LayerJob::ChunkLength(const Head& head, int32_t chunk) const {
  const int64_t first = head.begin + int64_t{chunk} * chunk_size_;
  return static_cast<int32_t>(std::min<int64_t>(chunk_size_, head.end - first));
}

template <typename Body>
void LayerJob::ParallelOverHeads(bool (*want)(const Head&), Body body) {
  std::vector<int32_t> chosen;
  for (const Head& head : heads_) {
    if (want(head)) chosen.push_back(head.index);
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, chosen.size()),
                    [&](const tbb::blocked_range<size_t>& range) {
                      for (size_t i = range.begin(); i != range.end(); ++i) {
                        body(heads_[chosen[i]]);
                      }
                    });
}

absl::Status LayerJob::Run() {
  out_->passes_run = 0;
  if (!LoadHeads()) return BadInput();
  for (int32_t pass = 0; pass < plan_.options.max_passes; ++pass) {
    if (control_.IsCancelled()) return absl::CancelledError("job cancelled");
    const bool any_long = SetUpPass(pass);
    // Without a floor every edge is a candidate, so the merges follow from the lengths.
    const bool predictable = std::isinf(floor_);
    bool fused = false;
    if (any_long && predictable) {
      PredictMerges();
      fused = AllCandidatesKept();
    }
    const bool stop = !any_long || (fused && !AnyMerges());
    if (pass == 0) {  // the input is checked before any of it is used
      if (stop) {
        CheckInputRows([](const Head&) { return false; });
      } else if (fused) {
        CheckInputRows([](const Head& h) { return h.merges > 0; });
      } else {
        CheckInputRows([](const Head& h) { return h.active; });
      }
      if (bad_input_.load()) return BadInput();
    }
    if (stop) break;
    if (fused) {
      PrepareSinks(pass, /*fused=*/true);
      RunChunks(/*match=*/true, /*merge=*/true, /*fused=*/true);
      if (bad_input_.load()) return BadInput();
    } else {
      RunChunks(/*match=*/true, /*merge=*/false, /*fused=*/false);
      if (bad_input_.load()) return BadInput();
      if (control_.IsCancelled()) return absl::CancelledError("job cancelled");
      CountMerges();
      if (!AnyMerges()) break;
      SelectEdges();
      PrepareSinks(pass, /*fused=*/false);
      RunChunks(/*match=*/false, /*merge=*/true, /*fused=*/false);
    }
    if (control_.IsCancelled()) return absl::CancelledError("job cancelled");
    ParallelOverHeads([](const Head& h) { return h.merges > 0; },
                      [&](Head& head) { FinishHead(head); });
    out_->passes_run = pass + 1;
  }
  Finalize();
  if (bad_input_.load()) return BadInput();  // a value found in the result rows
  return absl::OkStatus();
}

bool LayerJob::LoadHeads() {
  const int32_t n = layer_.num_tokens;
  heads_.resize(static_cast<size_t>(layer_.num_heads));
  for (Head& head : heads_) head.Reset();
  bool valid = true;
  for (int32_t h = 0; h < layer_.num_heads; ++h) {
    Head& head = heads_[h];
    head.index = h;
    head.passthrough = plan_.passthrough[h];
    head.length = n;
    head.counts.resize(static_cast<size_t>(n));
    uint64_t sum = 0;
    uint32_t zero = 0;
    for (int32_t t = 0; t < n; ++t) {
      const uint32_t count = layer_.CountAt(h, t);
      zero |= static_cast<uint32_t>(count == 0);
      sum += count;
      head.counts[t] = count;
    }
    valid = valid && zero == 0 && sum <= UINT32_MAX;
  }
  return valid;
}

// CheckLayerData names what is wrong with the input (it walks the job in order). If it finds
// nothing, the bad row the job saw is gone: the caller wrote its tensors during the job (a
// client writing its shared memory region while the server reads it).
absl::Status LayerJob::BadInput() const {
  absl::Status status = CheckLayerData(layer_);
  return status.ok() ? absl::AbortedError(
                           "the input changed while the job read it (a NaN, Inf or zero count "
                           "was seen, then gone): its tensors must not be written during a job")
                     : status;
}

// The input rows that pass 0's chunk tasks will not read (they check their own chunks
// before using them): every row of a head that `chunked` does not pick, and the protected
// rows of one it picks.
void LayerJob::CheckInputRows(bool (*chunked)(const Head&)) {
  check_chunks_ = true;
  ParallelOverHeads(
      [](const Head&) { return true; },
      [&](Head& head) {
        const RowBlock keys = Keys(head), values = Values(head);
        auto check = [&](int64_t first, int64_t count) {
          if (count <= 0) return;
          const auto rows = static_cast<int32_t>(count);
          if (!kernels_.rows_finite(&keys, first, rows, key_dim_) ||
              !kernels_.rows_finite(&values, first, rows, value_dim_)) {
            bad_input_.store(true);
          }
        };
        if (chunked(head) && head.num_chunks > 0) {
          check(0, head.begin);
          check(head.end, head.length - head.end);
        } else {
          check(0, head.length);
        }
      });
}

// Steps 1-2: which heads take part, their compressible range and chunks. Returns whether
// any head is longer than the target.
bool LayerJob::SetUpPass(int32_t pass) {
  floor_ = plan_.FloorForPass(pass);
  bool any_long = false;
  for (Head& head : heads_) {
    head.active = !head.passthrough && head.length > target_;
    head.candidates = 0;
    head.merges = 0;
    head.num_chunks = 0;
    if (!head.active) continue;
    any_long = true;
    head.begin = plan_.options.sink_tokens;
    head.end = head.length - plan_.options.recent_tokens;
    if (head.end - head.begin >= 2) {
      head.num_chunks =
          static_cast<int32_t>((head.end - head.begin + chunk_size_ - 1) / chunk_size_);
    }
    head.edges.resize(static_cast<size_t>(head.num_chunks) * slots_);
  }
  return any_long;
}

// Step 5 without a floor: every source of a chunk of two or more rows is a candidate.
void LayerJob::PredictMerges() {
  for (Head& head : heads_) {
    if (!head.active) continue;
    for (int32_t c = 0; c < head.num_chunks; ++c) {
      const int32_t length = ChunkLength(head, c);
      if (length >= 2) head.candidates += (length + 1) / 2;
    }
    head.merges = std::min(head.length - target_, head.candidates);
  }
  ApplyUniformHeads();
}

// Step 5 after matching: the candidates found.
void LayerJob::CountMerges() {
  for (Head& head : heads_) {
    if (!head.active) continue;
    head.candidates = std::count_if(head.edges.begin(), head.edges.end(),
                                    [](const Edge& edge) { return edge.candidate; });
    head.merges = std::min(head.length - target_, head.candidates);
  }
  ApplyUniformHeads();
}

void LayerJob::ApplyUniformHeads() {
  if (!plan_.options.uniform_heads) return;
  int64_t r = INT64_MAX;
  for (const Head& head : heads_) {
    if (!head.passthrough) r = std::min(r, head.merges);  // inactive heads count as 0
  }
  for (Head& head : heads_) head.merges = head.passthrough ? 0 : r;
}

bool LayerJob::AllCandidatesKept() const {
  return std::all_of(heads_.begin(), heads_.end(), [](const Head& head) {
    return head.merges == 0 || head.merges == head.candidates;
  });
}

bool LayerJob::AnyMerges() const {
  return std::any_of(heads_.begin(), heads_.end(), [](const Head& h) { return h.merges > 0; });
}

// Where this pass writes each merging head, and where each chunk's survivors start.
void LayerJob::PrepareSinks(int32_t pass, bool fused) {
  bool last = pass + 1 >= plan_.options.max_passes;
  if (!last) {
    last = std::none_of(heads_.begin(), heads_.end(), [&](const Head& head) {
      return !head.passthrough && head.length - head.merges > target_;
    });
  }
  if (last) AllocateOutput();
  for (Head& head : heads_) {
    if (head.merges <= 0) continue;
    const int64_t new_length = head.length - head.merges;
    head.sink = last ? Sink::kOutput : head.owned ? Sink::kInPlace : Sink::kFreshState;
    if (head.sink == Sink::kFreshState) {  // the compressible rows only (rows from end on:
      const int64_t new_end = head.end - head.merges;  // recent, read from the input)
      head.keys.resize(static_cast<size_t>(new_end) * key_dim_);
      head.values.resize(static_cast<size_t>(new_end) * value_dim_);
    }
    if (head.sink != Sink::kOutput) head.next_counts.resize(static_cast<size_t>(new_length));
    if (with_assignment_) head.remap.resize(static_cast<size_t>(head.length));
    head.chunk_start.resize(static_cast<size_t>(head.num_chunks) + 1);
    int64_t next = head.begin;
    for (int32_t c = 0; c < head.num_chunks; ++c) {
      head.chunk_start[c] = next;
      const int32_t length = ChunkLength(head, c);
      int64_t sources = 0;
      if (fused) {
        sources = length >= 2 ? (length + 1) / 2 : 0;
      } else {
        const Edge* edges = head.edges.data() + static_cast<size_t>(c) * slots_;
        for (int32_t i = 0; i < (length + 1) / 2; ++i) sources += edges[i].kept ? 1 : 0;
      }
      next += length - sources;
    }
    head.chunk_start[head.num_chunks] = next;
    assert(next == head.end - head.merges);
  }
}

void LayerJob::RunChunks(bool match, bool merge, bool fused) {
  const bool check = check_chunks_;  // the first pass checks each chunk's input rows
  check_chunks_ = false;
  // Every input row ends up in exactly one result row (merged or not, after any number of
  // passes), and a result row is finite exactly when every input row merged into it is (a
  // count-weighted mean of finite floats is finite, in float64 between passes too; an Inf or
  // NaN term makes it Inf or NaN, and it stays so). So the chunks' values, which matching
  // does not read, are checked in the result rows as they are written (BlockWriter::finite,
  // MergeChunk and WriteOutputRows) rather than in an extra sweep over the input; Run then
  // fails the job. The keys are checked as they are widened for matching (MatchChunk).
  assert(!check || match);  // the first RunChunks of a job matches
  if (check) values_at_output_ = true;
  std::vector<Task> tasks;
  for (const Head& head : heads_) {
    const bool wanted = merge ? head.merges > 0 : head.active;
    for (int32_t c = 0; wanted && c < head.num_chunks; ++c) tasks.push_back({head.index, c});
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tasks.size()),
                    [&](const tbb::blocked_range<size_t>& range) {
                      ChunkScratch& scratch = scratch_->local();
                      for (size_t i = range.begin(); i != range.end(); ++i) {
                        // Per chunk, and inside the matching (StopCheck) and merging of
                        // one: a cancelled job stops within about a millisecond's work per
                        // thread whatever the chunk size.
                        if (control_.IsCancelled()) return;
                        Head& head = heads_[tasks[i].head];
                        if (match) {
                          // The next task's rows stream into L2 while this chunk is matched.
                          PrefetchRanges next{{nullptr, nullptr}, {0, 0}};
                          if (i + 1 != range.end()) {
                            next = ChunkRanges(heads_[tasks[i + 1].head], tasks[i + 1].chunk,
                                               /*with_values=*/merge);
                          }
                          if (!MatchChunk(head, tasks[i].chunk, fused, check, next, scratch)) {
                            bad_input_.store(true);
                            continue;
                          }
                        }
                        // A match cut short leaves its edges unspecified: no merge.
                        if (match && control_.IsCancelled()) return;
                        if (merge) MergeChunk(head, tasks[i].chunk, fused, scratch);
                      }
                    });
}

// Step 6 for every merging head.
void LayerJob::SelectEdges() {
  ParallelOverHeads(
      [](const Head& h) { return h.merges > 0; },
      [&](Head& head) { KeepBest(head.edges, head.merges, bound_, Scorer(head), &head.order); });
}

// The rows of every head not written by a last pass, and the assignment.
void LayerJob::Finalize() {
  for (Head& head : heads_) head.merges = 0;
  AllocateOutput();
  ParallelOverHeads([](const Head&) { return true; }, [&](Head& head) { FinalizeHead(head); });
  if (fp8_staged_) NarrowStagedRows();
  // Every result row went out through a BlockWriter, which saw each rounding (fp8 saturates).
  if (output_type_ != ElemType::kF32) {
    using Check = CompressResult::RoundingCheck;
    out_->key_rounding = keys_overflow_.load() ? Check::kOverflows : Check::kFits;
    out_->value_rounding = values_overflow_.load() ? Check::kOverflows : Check::kFits;
  }
}

}  // namespace centroidkv::cpu
