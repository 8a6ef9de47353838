// The protocol codec, part 2: tensor bytes as TensorSlabs. One writer (a job's tensors in a
// fixed order, cut into slabs no larger than the receiver takes) and one assembler (slabs
// into preallocated tensors, strictly in order), used by both ends: the client writes a
// job's input and assembles its result, the server assembles the input and writes the
// result. The framing rules live here once (docs/protocol.md, "Slabs").
// Thread-compatible: each object belongs to one job on one stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv {

// The slab payload to use: `wanted` bytes, no more than the receiver's `limit` (0: it
// states none), never below 8, and a multiple of 8 so that a slab holds whole elements of
// every dtype. The server's GetInfo limits.max_slab_bytes is the limit a client honours.
int32_t SlabPayloadBytes(int64_t wanted, int64_t limit);

// Writes the tensors of one job, in the order given, as slabs of at most slab_bytes each.
class SlabWriter {
 public:
  // Copies `length` bytes of the tensor, starting at byte `offset`, to `out`: for tensors
  // whose wire bytes are made while sending (rows rounded to the output dtype).
  using CopyBytes = std::function<void(uint64_t offset, uint64_t length, char* out)>;
  struct Tensor {
    v1::Tensor tensor = v1::TENSOR_UNSPECIFIED;
    uint64_t bytes = 0;              // a tensor of 0 bytes is skipped
    const void* data = nullptr;      // the wire bytes, or null with `copy`
    CopyBytes copy;                  // used when data is null
  };

  SlabWriter(uint64_t job_id, std::vector<Tensor> tensors, int32_t slab_bytes);

  // Fills `slab` with the next slab; false (slab untouched) when every byte has been written.
  bool Next(v1::TensorSlab* slab);
  bool done() const;

 private:
  // Moves past tensors with no bytes left.
  void Seek();

  uint64_t job_id_;
  std::vector<Tensor> tensors_;
  uint64_t slab_bytes_;
  size_t index_ = 0;     // the tensor being written
  uint64_t cursor_ = 0;  // its bytes already written
};

// Assembles the slabs of one job into tensors of known sizes. Each tensor must arrive in
// order: every slab starts where the previous one of its tensor ended.
class SlabAssembler {
 public:
  struct Tensor {
    v1::Tensor tensor = v1::TENSOR_UNSPECIFIED;
    void* data = nullptr;   // `bytes` writable bytes
    uint64_t bytes = 0;
    const char* field = "";  // the request field a missing tensor is named by, e.g. "keys"
  };

  // `side` names the message in errors ("slab" for a request, "result slab" for a response).
  SlabAssembler(uint64_t job_id, std::vector<Tensor> tensors, const char* side = "slab");

  // Copies one slab into place. Framing (the stream cannot be trusted after it):
  // FAILED_PRECONDITION for a slab that overlaps bytes already received or leaves a gap.
  // The job alone: INVALID_ARGUMENT naming slab.tensor for a tensor the job does not have,
  // slab.data for bytes past the tensor's end or an empty slab.
  absl::Status Add(const v1::TensorSlab& slab);

  bool complete() const;
  // The tensors still short of bytes, e.g. "TENSOR_VALUES (0 of 4096 bytes)".
  std::string MissingTensors() const;
  // The first of them by its field ("keys", ...); "" when complete.
  const char* FirstMissingField() const;
  // Bytes received so far, and expected in all, over every tensor.
  uint64_t received_bytes() const;
  uint64_t total_bytes() const;

 private:
  struct Progress {
    Tensor tensor;
    uint64_t received = 0;
  };
  uint64_t job_id_;
  std::vector<Progress> tensors_;
  const char* side_;
};

}  // namespace centroidkv
