// Same-node shared memory for the C++ client: a region of this process's memory (a file
// under /dev/shm, mapped here and registered with the server) that jobs name by reference,
// so their tensors never cross the socket; and ShmLayerStack, a region laid out for a stack
// of layers of one shape (each slot: the input keys, values, counts and room for the
// largest result), which builds the LayerJobs that use it. Only on a unix socket
// connection to a server with shared memory on (GetInfo says, ServerInfo::shared_memory).
// Thread-compatible: the caller fills a slot and must not touch it while its job runs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"

namespace centroidkv::client {

class ShmRegion {
 public:
  // Creates a fresh file of `bytes` under /dev/shm (a unique name), maps it, and registers it
  // with the server `client` talks to. `client` must outlive the region.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(Client* client, uint64_t bytes);
  // Unregisters (best effort), unmaps and removes the file.
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  uint64_t region_id() const { return region_id_; }
  const std::string& name() const { return name_; }  // e.g. "/ckv-1234-1"
  // Whether [p, p + bytes) lies inside the region; its offset there.
  std::optional<uint64_t> OffsetOf(const void* p, uint64_t bytes) const;

 private:
  ShmRegion() = default;
  Client* client_ = nullptr;
  std::string name_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t region_id_ = 0;
};

class ShmLayerStack {
 public:
  // A region of `layers` input slots for layers shaped like `shape` (dtype, layout, heads,
  // tokens, dims; counts when shape.counts is non-null; not ragged) and `output_slots`
  // result slots (-1: one per layer) for them compressed with `options` into `output_dtype`
  // (default: the input dtype). Fewer output slots than layers suit a client that keeps a
  // whole model's KV in the region but has only a few jobs in flight.
  static absl::StatusOr<std::unique_ptr<ShmLayerStack>> Create(
      Client* client, const LayerView& shape, int32_t layers, const CompressOptions& options,
      std::optional<DType> output_dtype = std::nullopt, int32_t output_slots = -1);

  int32_t layers() const { return static_cast<int32_t>(inputs_.size()); }
  int32_t output_slots() const { return static_cast<int32_t>(outputs_.size()); }
  // Slot `i`'s input, to fill before submitting its job.
  void* keys(int32_t i) const;
  void* values(int32_t i) const;
  uint32_t* counts(int32_t i) const;  // null without counts
  // Copies `layer` (shaped like the stack's layers) into input slot `i`: for a client whose
  // tensors are elsewhere; one that produces them in the slot needs no copy.
  void Fill(int32_t i, const LayerView& layer) const;
  // The job of layer `i`: input read in place, result written to output slot `output`
  // (default: slot i), which must not be in use by another job in flight. fp8 layers: the
  // job carries the shape's key / value scales; set job.layer.key_scales / value_scales to
  // the layer's own where they differ by layer.
  LayerJob Job(int32_t i, int32_t output = -1) const;
  ShmRegion& region() const { return *region_; }

 private:
  struct InputSlot {
    uint64_t keys = 0, values = 0, counts = 0;
  };
  ShmLayerStack() = default;
  std::unique_ptr<ShmRegion> region_;
  LayerView shape_;
  CompressOptions options_;
  std::optional<DType> output_dtype_;
  std::vector<InputSlot> inputs_;
  std::vector<ShmOutputSlot> outputs_;
};

}  // namespace centroidkv::client
