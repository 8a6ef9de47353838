// ShmRegion (a /dev/shm file mapped and registered) and ShmLayerStack (its slot layout).
#include "centroidkv/client/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "centroidkv/wire/job_codec.h"

namespace centroidkv::client {
namespace {

constexpr uint64_t kAlignment = 64;  // every tensor starts on a cache line

uint64_t AlignUp(uint64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(Client* client, uint64_t bytes) {
  static std::atomic<uint64_t> counter{0};
  if (bytes == 0) return absl::InvalidArgumentError("shm region: size must be positive");
  std::unique_ptr<ShmRegion> region(new ShmRegion());
  region->name_ = absl::StrCat("/ckv-", getpid(), "-", counter.fetch_add(1), "-",
                               reinterpret_cast<uintptr_t>(region.get()) & 0xffff);
  // 0660: a sidecar server of another uid maps it through a shared group (the pod's
  // fsGroup); the server still accepts only files owned by this process's uid.
  const int fd = shm_open(region->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
  if (fd >= 0) (void)fchmod(fd, 0660);  // whatever the umask
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("shm region: shm_open('", region->name_, "'): ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(region->name_.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region: cannot size '", region->name_, "' to ", bytes,
                     " bytes: ", std::strerror(error)));
  }
  // The region's memory is reserved now (tmpfs pages allocated, charged to this process):
  // a /dev/shm too small (a pod's emptyDir sizeLimit) is an error here, not a SIGBUS when
  // this process or the server first writes a page, and the server's writes of results
  // find their pages allocated.
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    close(fd);
    shm_unlink(region->name_.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region: cannot reserve ", bytes, " bytes for '", region->name_,
                     "' (is /dev/shm large enough?): ", std::strerror(error)));
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    shm_unlink(region->name_.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shm region: mmap of ", bytes, " bytes: ", std::strerror(errno)));
  }
  region->data_ = static_cast<uint8_t*>(mapping);
  region->size_ = bytes;
  absl::StatusOr<Client::Region> registered = client->RegisterRegion(region->name_, 0, bytes);
  if (!registered.ok()) return registered.status();  // the destructor unmaps and unlinks
  region->client_ = client;
  region->region_id_ = registered->region_id;
  return region;
}

ShmRegion::~ShmRegion() {
  if (client_ != nullptr) (void)client_->UnregisterRegion(region_id_);
  if (data_ != nullptr) munmap(data_, size_);
  if (!name_.empty()) shm_unlink(name_.c_str());
}

std::optional<uint64_t> ShmRegion::OffsetOf(const void* p, uint64_t bytes) const {
  const auto* byte = static_cast<const uint8_t*>(p);
  if (byte < data_ || byte > data_ + size_) return std::nullopt;
  const uint64_t offset = static_cast<uint64_t>(byte - data_);
  if (bytes > size_ - offset) return std::nullopt;
  return offset;
}

absl::StatusOr<std::unique_ptr<ShmLayerStack>> ShmLayerStack::Create(
    Client* client, const LayerView& shape, int32_t layers, const CompressOptions& options,
    std::optional<DType> output_dtype, int32_t output_slots) {
  if (layers <= 0) return absl::InvalidArgumentError("shm layer stack: layers must be positive");
  if (output_slots < 0) output_slots = layers;
  if (shape.head_offsets != nullptr) {
    return absl::InvalidArgumentError("shm layer stack: ragged layers are not laid out here");
  }
  std::unique_ptr<ShmLayerStack> stack(new ShmLayerStack());
  stack->shape_ = shape;
  stack->options_ = options;
  stack->output_dtype_ = output_dtype;
  const InputBytes in = InputBytesOf(shape);
  const ResultBytes out =
      MaxResultTensorBytes(shape, options, output_dtype.value_or(shape.dtype));
  uint64_t cursor = 0;
  auto take = [&cursor](uint64_t bytes) {
    const uint64_t at = cursor;
    cursor += AlignUp(bytes);
    return at;
  };
  for (int32_t i = 0; i < layers; ++i) {
    InputSlot slot;
    slot.keys = take(in.keys);
    slot.values = take(in.values);
    slot.counts = take(in.counts);
    stack->inputs_.push_back(slot);
  }
  for (int32_t i = 0; i < output_slots; ++i) {
    ShmOutputSlot slot;
    slot.keys_bytes = out.keys;
    slot.keys_offset = take(out.keys);
    slot.values_bytes = out.values;
    slot.values_offset = take(out.values);
    slot.counts_bytes = out.counts;
    slot.counts_offset = take(out.counts);
    slot.assignment_bytes = out.assignment;
    slot.assignment_offset = take(out.assignment);
    stack->outputs_.push_back(slot);
  }
  absl::StatusOr<std::unique_ptr<ShmRegion>> region = ShmRegion::Create(client, cursor);
  if (!region.ok()) return region.status();
  stack->region_ = *std::move(region);
  return stack;
}

void* ShmLayerStack::keys(int32_t i) const { return region_->data() + inputs_[i].keys; }
void* ShmLayerStack::values(int32_t i) const { return region_->data() + inputs_[i].values; }
uint32_t* ShmLayerStack::counts(int32_t i) const {
  if (shape_.counts == nullptr) return nullptr;
  return reinterpret_cast<uint32_t*>(region_->data() + inputs_[i].counts);
}

void ShmLayerStack::Fill(int32_t i, const LayerView& layer) const {
  const InputBytes bytes = InputBytesOf(layer);
  std::memcpy(keys(i), layer.keys, bytes.keys);
  std::memcpy(values(i), layer.values, bytes.values);
  if (bytes.counts > 0 && counts(i) != nullptr) std::memcpy(counts(i), layer.counts, bytes.counts);
}

LayerJob ShmLayerStack::Job(int32_t i, int32_t output) const {
  LayerJob job;
  job.layer_index = static_cast<uint32_t>(i);
  job.layer = shape_;
  job.layer.keys = keys(i);
  job.layer.values = values(i);
  job.layer.counts = counts(i);
  job.options = options_;
  job.output_dtype = output_dtype_;
  job.shm_region = region_.get();
  if (output < 0) output = i;
  if (output < output_slots()) job.shm_output = outputs_[output];
  return job;
}

}  // namespace centroidkv::client
