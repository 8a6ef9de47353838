// Turns one finished job into the messages that carry it back, through the protocol codec:
// a JobResult header (JobResultHeaderToProto), then slabs of out keys, out values (rounded
// once to the output dtype while copying, unless the engine wrote them so), out counts and
// the assignment (SlabWriter). Slabs are produced one at a time, as the stream's single
// write allows, so a result is never held twice in memory. The result goes back to its pool
// as soon as the last slab has been copied out of it (before that slab is written).
// Thread-compatible: owned by one stream.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "centroidkv/wire/job_codec.h"
#include "centroidkv/wire/slab_codec.h"
#include "service/result_pool.h"

namespace centroidkv::service {

// The output tensors of `result` in the order they travel, each as its wire bytes in
// `output_dtype` (rows the engine wrote in float32 are rounded while copied out); also
// what a result written to shared memory copies (service/shm/job_regions.h).
std::vector<SlabWriter::Tensor> ResultTensors(const CompressResult& result, DType output_dtype);

class ResultEncoder {
 public:
  // `in_region`: the tensors were already written to the job's output region; only the
  // header (in_region set) goes out.
  ResultEncoder(uint64_t job_id, uint32_t layer_index, DType output_dtype,
                ResultProvenance provenance, PooledResult result, int32_t slab_bytes,
                bool in_region = false);

  // Fills `message` with the next message of this job; returns false when none is left.
  bool Next(v1::CompressResponse* message);
  uint64_t job_id() const { return job_id_; }
  // Whether the result is still held (false once its last slab has been produced).
  bool holds_result() const { return result_ != nullptr; }

 private:
  uint64_t job_id_;
  uint32_t layer_index_;
  DType output_dtype_;
  ResultProvenance provenance_;
  PooledResult result_;  // released once fully copied out
  bool header_sent_ = false;
  bool in_region_ = false;
  std::optional<SlabWriter> slabs_;  // over result_'s arrays
};

}  // namespace centroidkv::service
