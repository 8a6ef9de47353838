// LayerJob, one chunk at a time and one head after its chunks: SPEC.md section 2 steps 3-4
// (matching a chunk's sources to its destinations) and step 7 (merging a chunk's kept edges
// and writing its surviving rows where the pass puts them: the result, a fresh float64
// state, or in place), then the end of a pass for a head (protected rows, the in-place
// shift, the new lengths, counts and assignment map). Which chunks run, and when, is
// layer_job.cc's; the result rows go out through layer_job_output.cc.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/layer_job.h"

namespace centroidkv::cpu {

// The memory of one chunk's key rows (and value rows) where each is one contiguous block.
PrefetchRanges LayerJob::ChunkRanges(const Head& head, int32_t chunk, bool with_values) const {
  PrefetchRanges ranges{{nullptr, nullptr}, {0, 0}};
  const int64_t first = head.begin + int64_t{chunk} * chunk_size_;
  const int32_t length = ChunkLength(head, chunk);
  const int64_t element_bytes = head.owned ? int64_t{sizeof(double)} : input_element_bytes_;
  const RowBlock keys = Keys(head), values = Values(head);
  if (keys.stride == key_dim_) {
    ranges.data[0] = static_cast<const char*>(keys.data) + first * key_dim_ * element_bytes;
    ranges.bytes[0] = int64_t{length} * key_dim_ * element_bytes;
  }
  if (with_values && values.stride == value_dim_) {
    ranges.data[1] = static_cast<const char*>(values.data) + first * value_dim_ * element_bytes;
    ranges.bytes[1] = int64_t{length} * value_dim_ * element_bytes;
  }
  return ranges;
}

// Steps 3-4 for one chunk; with `fused`, every edge is kept (step 6 keeps all candidates).
// With `check_keys`, the key rows are checked for Inf and NaN as they are widened: false when
// one holds either (nothing matched).
bool LayerJob::MatchChunk(Head& head, int32_t chunk, bool fused, bool check_keys,
                          const PrefetchRanges& next, ChunkScratch& scratch) {
  const int64_t first = head.begin + int64_t{chunk} * chunk_size_;
  const int32_t length = ChunkLength(head, chunk);
  Edge* edges = head.edges.data() + static_cast<size_t>(chunk) * slots_;
  std::fill(edges, edges + slots_, Edge{});
  if (length < 2) {  // a lone source has no destination
    edges[0].source = static_cast<int32_t>(first);
    if (check_keys) {
      const RowBlock keys = Keys(head);
      return kernels_.rows_finite(&keys, first, length, key_dim_);
    }
    return true;
  }
  const int32_t sources = (length + 1) / 2;
  GrowScratch(&scratch.matches, static_cast<size_t>(sources));
  if (!scratch.matcher.Match(kernels_, Keys(head), first, length, key_dim_,
                             scratch.matches.data(), &next, check_keys, &stop_)) {
    return false;
  }
  // Stopped inside the kernel (the matches are unspecified); RunChunks sees it too.
  if (control_.IsCancelled()) return true;
  if (!ResolveChunkEdges(scratch.matches.data(), &scratch.matcher, first, floor_, bound_,
                         Scorer(head), edges)) {
    bad_input_.store(true);  // the keys changed while the job read them (BadInput)
  }
  if (fused) {
    for (int32_t i = 0; i < sources; ++i) edges[i].kept = edges[i].candidate;
  }
  return true;
}

// The kept sources of each destination of the chunk, in the order they are summed.
void LayerJob::BucketSources(const Head& head, int32_t chunk, ChunkScratch& scratch) const {
  const int64_t first = head.begin + int64_t{chunk} * chunk_size_;
  const int32_t length = ChunkLength(head, chunk);
  const int32_t sources = (length + 1) / 2, destinations = length / 2;
  const Edge* edges = head.edges.data() + static_cast<size_t>(chunk) * slots_;
  scratch.bucket_offsets.assign(static_cast<size_t>(destinations) + 1, 0);
  for (int32_t i = 0; i < sources; ++i) {
    if (edges[i].kept) ++scratch.bucket_offsets[(edges[i].destination - first) / 2 + 1];
  }
  std::partial_sum(scratch.bucket_offsets.begin(), scratch.bucket_offsets.end(),
                   scratch.bucket_offsets.begin());
  scratch.bucket_cursor.assign(scratch.bucket_offsets.begin(), scratch.bucket_offsets.end() - 1);
  GrowScratch(&scratch.bucket_slots, static_cast<size_t>(scratch.bucket_offsets.back()));
  for (int32_t i = 0; i < sources; ++i) {
    if (edges[i].kept) {
      scratch.bucket_slots[scratch.bucket_cursor[(edges[i].destination - first) / 2]++] = i;
    }
  }
}

// Step 7 for one chunk: every surviving row (a destination with its merged sources, or a
// row left alone) is written to its new place. Right after matching the same chunk
// (`fused`), the keys are read from the matcher's float tile when it holds them exactly.
void LayerJob::MergeChunk(Head& head, int32_t chunk, bool fused, ChunkScratch& scratch) {
  const int64_t first = head.begin + int64_t{chunk} * chunk_size_;
  const int32_t length = ChunkLength(head, chunk);
  Edge* edges = head.edges.data() + static_cast<size_t>(chunk) * slots_;
  BucketSources(head, chunk, scratch);
  const ExactScorer scorer = Scorer(head);
  const int32_t destinations = length / 2;
  for (int32_t k = 0; k < destinations; ++k) {
    const int32_t begin = scratch.bucket_offsets[k], end = scratch.bucket_offsets[k + 1];
    if (end - begin < 2) continue;
    OrderSources(edges, std::span<int32_t>(scratch.bucket_slots.data() + begin, end - begin),
                 bound_, scorer);
  }
  ChunkRows rows{ShiftRows(Keys(head), first), ShiftRows(Values(head), first), nullptr, nullptr,
                 nullptr, nullptr};
  const float* tile = fused && length >= 2 ? scratch.matcher.ExactRows() : nullptr;
  if (tile != nullptr) {
    rows.keys = RowBlock{tile, ElemType::kF32, key_dim_};
  }
  // Values widened in one sequential sweep, which streams from memory far better than the
  // scattered row order of the merges below; unless the rows are one contiguous block, which
  // the matching of the chunk before has prefetched into L2 (LayerJob::ChunkRanges). fp8 rows
  // are widened so too: a code takes several operations to widen, and a merge of more than
  // two rows would widen it at the float64 path's half width.
  if (tile != nullptr && (rows.values.stride != value_dim_ || IsFp8Elem(rows.values.type))) {
    GrowScratch(&scratch.value_tile, static_cast<size_t>(length) * value_dim_);
    kernels_.convert_rows_f32(&rows.values, 0, length, value_dim_, scratch.value_tile.data());
    rows.values = RowBlock{scratch.value_tile.data(), ElemType::kF32, value_dim_};
  }
  if (head.sink == Sink::kInPlace) {
    GrowScratch(&scratch.staged, static_cast<size_t>(length) * (key_dim_ + value_dim_));
    rows.staged_keys = scratch.staged.data();
    rows.staged_values = scratch.staged.data() + static_cast<size_t>(length) * key_dim_;
  }
  const int64_t start = head.chunk_start[chunk];
  if (head.sink == Sink::kOutput) {  // the chunk's rows are one block of the result
    StartOutput(head.index, out_->offsets[head.index] + start, scratch);
    rows.output_keys = &scratch.key_writer;
    rows.output_values = &scratch.value_writer;
  }
  int64_t survivors = 0;
  constexpr int32_t kRowsBetweenChecks = 4096;  // a few hundred microseconds of merging
  bool stopped = false;
  for (int32_t offset = 0; offset < length; ++offset) {
    if (offset % kRowsBetweenChecks == 0 && offset > 0 && control_.IsCancelled()) {
      stopped = true;
      break;
    }
    if (offset % 2 == 0 && edges[offset / 2].kept) continue;  // merged into its destination
    const int64_t row = first + offset;
    const int64_t new_row = start + survivors;
    scratch.terms.clear();
    uint64_t count = head.counts[row];
    if (offset % 2 == 1) {
      const int32_t k = offset / 2;
      for (int32_t b = scratch.bucket_offsets[k]; b < scratch.bucket_offsets[k + 1]; ++b) {
        if (scratch.terms.empty()) scratch.terms.push_back({offset, static_cast<double>(count)});
        const int32_t source = edges[scratch.bucket_slots[b]].source;
        scratch.terms.push_back({source - first, static_cast<double>(head.counts[source])});
        count += head.counts[source];
      }
    }
    WriteRow(head, rows, offset, new_row, survivors, scratch.terms, count);
    if (with_assignment_) head.remap[row] = static_cast<int32_t>(new_row);
    ++survivors;
  }
  if (stopped) {  // cancelled: Run() drops the job and its half-written rows
    if (head.sink == Sink::kOutput) {
      scratch.key_writer.Finish();
      scratch.value_writer.Finish();
      FenceStreamedStores();
    }
    return;
  }
  if (with_assignment_) {
    for (int32_t i = 0; i < (length + 1) / 2; ++i) {
      if (edges[i].kept) head.remap[edges[i].source] = head.remap[edges[i].destination];
    }
  }
  if (head.sink == Sink::kOutput) {
    scratch.key_writer.Finish();
    scratch.value_writer.Finish();
    FenceStreamedStores();
    if (values_at_output_ && !scratch.value_writer.finite()) bad_input_.store(true);
    NoteWritten(head.index, scratch.key_writer, scratch.value_writer);
  }
  if (head.sink == Sink::kInPlace) {  // back into the chunk's own rows; ShiftInPlace moves them
    std::memcpy(head.keys.data() + first * key_dim_, rows.staged_keys,
                sizeof(double) * survivors * key_dim_);
    std::memcpy(head.values.data() + first * value_dim_, rows.staged_values,
                sizeof(double) * survivors * value_dim_);
  }
}

// Writes chunk row `offset` (merged with `terms` when there are any) as new row `new_row` of
// the head (or, in place, as row `staged_row` of the staging buffers), with count `count`.
void LayerJob::WriteRow(Head& head, const ChunkRows& rows, int64_t offset, int64_t new_row,
                        int64_t staged_row, const std::vector<MergeTerm>& terms, uint64_t count) {
  double* key_dst = nullptr;
  double* value_dst = nullptr;
  switch (head.sink) {
    case Sink::kOutput: {
      float* key_out = rows.output_keys->Next();
      float* value_out = rows.output_values->Next();
      if (terms.empty()) {
        kernels_.convert_row_f32(&rows.keys, offset, key_dim_, key_out);
        kernels_.convert_row_f32(&rows.values, offset, value_dim_, value_out);
      } else {
        const auto n = static_cast<int32_t>(terms.size());
        const auto total = static_cast<double>(count);
        kernels_.merge_row_f32(&rows.keys, terms.data(), n, total, key_dim_, key_out);
        kernels_.merge_row_f32(&rows.values, terms.data(), n, total, value_dim_, value_out);
      }
      WriteCount(head, new_row, count);
      return;
    }
    case Sink::kFreshState:
      key_dst = head.keys.data() + new_row * key_dim_;
      value_dst = head.values.data() + new_row * value_dim_;
      break;
    case Sink::kInPlace:
      key_dst = rows.staged_keys + staged_row * key_dim_;
      value_dst = rows.staged_values + staged_row * value_dim_;
      break;
  }
  if (terms.empty()) {
    kernels_.convert_row_f64(&rows.keys, offset, key_dim_, key_dst);
    kernels_.convert_row_f64(&rows.values, offset, value_dim_, value_dst);
  } else {
    const auto n = static_cast<int32_t>(terms.size());
    const auto total = static_cast<double>(count);
    kernels_.merge_row_f64(&rows.keys, terms.data(), n, total, key_dim_, key_dst);
    kernels_.merge_row_f64(&rows.values, terms.data(), n, total, value_dim_, value_dst);
  }
  WriteCount(head, new_row, count);
}

void LayerJob::WriteCount(Head& head, int64_t new_row, uint64_t count) {
  if (head.sink == Sink::kOutput) {
    out_->counts[out_->offsets[head.index] + new_row] = static_cast<uint32_t>(count);
  } else {
    head.next_counts[new_row] = count;
  }
}

// After the chunks of a merging head: its protected rows, the in-place shift, the new
// lengths and counts, and the assignment.
void LayerJob::FinishHead(Head& head) {
  WriteProtectedRows(head);
  if (head.sink == Sink::kInPlace) ShiftInPlace(head);
  const int64_t new_end = head.end - head.merges;  // the owned rows: up to the recent window
  head.length -= head.merges;
  switch (head.sink) {
    case Sink::kOutput:
      head.written = true;
      break;
    case Sink::kFreshState:
      head.owned = true;
      head.counts.swap(head.next_counts);
      break;
    case Sink::kInPlace:
      head.keys.resize(static_cast<size_t>(new_end) * key_dim_);
      head.values.resize(static_cast<size_t>(new_end) * value_dim_);
      head.counts.swap(head.next_counts);
      break;
  }
  head.counts.resize(static_cast<size_t>(head.length));
  if (!with_assignment_) return;
  if (head.owner.empty()) {
    head.owner.swap(head.remap);  // the first merge: owner was the identity
  } else {
    for (int32_t& row : head.owner) row = head.remap[row];
  }
}

// Sinks [0, begin) keep their rows; recent rows [end, length) move down by the merges. Both
// stay in the input (Keys / Values hold the compressible rows only): the last pass writes
// them to the result, the others only renumber them.
void LayerJob::WriteProtectedRows(Head& head) {
  if (head.sink == Sink::kOutput) {  // the sinks and the recent rows: two blocks of the result
    const int64_t out_first = out_->offsets[head.index];
    WriteOutputRows(head.index, InputKeys(head), InputValues(head), 0, head.begin, out_first);
    WriteOutputRows(head.index, RecentKeys(head), RecentValues(head), head.end,
                    head.length - head.end, out_first + head.end - head.merges);
  }
  auto write = [&](int64_t row, int64_t new_row) {
    if (with_assignment_) head.remap[row] = static_cast<int32_t>(new_row);
    WriteCount(head, new_row, head.counts[row]);
  };
  for (int64_t row = 0; row < head.begin; ++row) write(row, row);
  for (int64_t row = head.end; row < head.length; ++row) write(row, row - head.merges);
}

// Moves each chunk's survivors (compacted at the chunk's start by MergeChunk) down to their
// new rows, in row order, so no move overwrites a row still to be moved.
void LayerJob::ShiftInPlace(Head& head) {
  auto move = [&](int64_t from, int64_t to, int64_t rows) {
    if (from == to || rows == 0) return;
    std::memmove(head.keys.data() + to * key_dim_, head.keys.data() + from * key_dim_,
                 sizeof(double) * rows * key_dim_);
    std::memmove(head.values.data() + to * value_dim_, head.values.data() + from * value_dim_,
                 sizeof(double) * rows * value_dim_);
  };
  for (int32_t c = 0; c < head.num_chunks; ++c) {
    const int64_t first = head.begin + int64_t{c} * chunk_size_;
    move(first, head.chunk_start[c], head.chunk_start[c + 1] - head.chunk_start[c]);
  }
}

}  // namespace centroidkv::cpu
