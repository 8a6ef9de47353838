// The shared memory of one job: the spans its StartJob named (region_codec.h) resolved
// against its owner's regions (RegionTable) and bounds-checked (each span within its
// region, the region's file still that large), as pointers the engine reads in place and
// the result is written to. Holding this object holds the job's mappings, so a region
// unregistered (or an owner gone) mid-job stays mapped until the job ends. A client that
// truncates a region's file is caught twice: at the job's start (fstat, a cheap early
// error) and at its end (the SigbusGuard mark left by a fault, or fstat again), so the job
// fails naming its span instead of the server dying or answering from zero pages.
// Thread-compatible: owned by one job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/types/compress_result.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/wire/region_codec.h"
#include "service/shm/mapped_region.h"
#include "service/shm/region_table.h"

namespace centroidkv::service {

struct MappedSpan {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;  // the span's bytes (for outputs: its capacity)
  const char* field = "";              // "start_job.region_input.keys", ...
  uint64_t region_id = 0;
  const MappedRegion* region = nullptr;  // held by the JobRegionMemory
};

class JobRegionMemory {
 public:
  // Errors name the field: NOT_FOUND "start_job.region_input.keys.region_id" for a region
  // the owner has not registered, OUT_OF_RANGE "...offset" for a span past its region's
  // end, FAILED_PRECONDITION (field ...region_id) for a region whose file shrank or that
  // was truncated under an earlier job (CheckUsable).
  static absl::StatusOr<JobRegionMemory> Resolve(const JobRegions& spans,
                                                 const RegionTable& table,
                                                 const std::string& owner_key);

  bool has_input() const { return keys_.has_value(); }
  bool has_output() const { return out_keys_.has_value(); }
  const MappedSpan& keys() const { return *keys_; }
  const MappedSpan& values() const { return *values_; }
  const std::optional<MappedSpan>& counts() const { return counts_; }

  // The output spans of the key and value rows as memory the engine may write the rows into
  // (CompressControl::row_target); nullopt without an output region.
  std::optional<ResultRowTarget> RowTarget() const;

  // Copies the result's tensors, rows rounded to `output_dtype` where the engine did not
  // write that dtype itself, into the output spans (the codec's order and bytes, as slabs
  // would carry them); rows the engine wrote there itself (result.rows_in_target) stay.
  // INTERNAL if a tensor exceeds its span (the StartJob check forbids).
  absl::Status WriteResult(const CompressResult& result, DType output_dtype) const;

  // At the job's start: Resolve's FAILED_PRECONDITION if a region's file has shrunk or a
  // fault has left the region unusable since (the job may have waited in the queue).
  absl::Status CheckUsable() const;
  // At the job's end, before its result is announced: DATA_LOSS naming the span the fault
  // hit (else the region's first span) when a region was truncated while job `job_id` used
  // it (its reads or writes then went to zero pages, or its output is gone).
  absl::Status CheckIntact(uint64_t job_id) const;

 private:
  std::optional<MappedSpan> keys_, values_, counts_;
  std::optional<MappedSpan> out_keys_, out_values_, out_counts_, out_log_weights_, assignment_;
  // The spans present, in the codec's order (inputs, then outputs).
  std::vector<const MappedSpan*> Spans() const;
  std::vector<std::shared_ptr<MappedRegion>> held_;  // the job's mappings
};

}  // namespace centroidkv::service
