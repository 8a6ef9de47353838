// StreamWorker: the steps of one batch on one stream, and the executor that queues the
// stages (RunBatchStages) as kernel launches.
#include "kernels/cuda/stream_worker.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "centroidkv/common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/layer_kernels.h"

namespace centroidkv::cuda {
namespace {

const char* StageName(StageId id) {
  switch (id) {
    case StageId::kInit: return "init";
    case StageId::kSetup: return "setup";
    case StageId::kNormalize: return "normalize";
    case StageId::kMatch: return "match";
    case StageId::kSelect: return "select";
    case StageId::kMarkKept: return "mark_kept";
    case StageId::kIndex: return "index";
    case StageId::kBucket: return "bucket";
    case StageId::kMerge: return "merge";
    case StageId::kOwner: return "owner";
    case StageId::kFinish: return "finish";
    case StageId::kEmit: return "emit";
    case StageId::kOffsets: return "offsets";
    case StageId::kMatchTiles: return "match_tiles";
    case StageId::kIndexCount: return "index_count";
    case StageId::kIndexPrefix: return "index_prefix";
  }
  return "stage";
}

// CKV_CUDA_SYNC_EACH_STAGE=1: wait for every launch, so that an error names its stage (slow).
bool SyncEachStage() {
  const char* value = std::getenv("CKV_CUDA_SYNC_EACH_STAGE");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// A pair of events around one launch (StreamWorker::ProfileCompute).
struct TimedLaunch {
  const char* stage;
  cudaEvent_t start;
  cudaEvent_t stop;
};

// The executor of RunBatchStages: each stage one launch on the stream; with `timed`, each
// launch between two events.
class DeviceExecutor {
 public:
  DeviceExecutor(const LayerBatch& batch, const BatchArrays& arrays, cudaStream_t stream,
                 void* sort_scratch, size_t sort_bytes, std::vector<TimedLaunch>* timed = nullptr)
      : batch_(batch), arrays_(arrays), stream_(stream), sort_scratch_(sort_scratch),
        sort_bytes_(sort_bytes), sync_(SyncEachStage()), timed_(timed) {}

  absl::Status Stage(StageId id, int64_t items, const PassArgs& pass) {
    CKV_RETURN_IF_ERROR(Begin(StageName(id)));
    CKV_CUDA_RETURN_IF_ERROR(LaunchStage(id, batch_.params(), arrays_, pass, items, stream_),
                             StageName(id));
    return End(StageName(id));
  }

  absl::Status Sort() {
    CKV_RETURN_IF_ERROR(Begin("segmented sort"));
    CKV_CUDA_RETURN_IF_ERROR(
        LaunchSegmentedSort(batch_.params(), arrays_, sort_scratch_, sort_bytes_, stream_),
        "segmented sort");
    return End("segmented sort");
  }

 private:
  absl::Status Begin(const char* what) {
    if (timed_ == nullptr) return absl::OkStatus();
    TimedLaunch launch{what, nullptr, nullptr};
    CKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&launch.start), "profile event");
    if (const cudaError_t error = cudaEventCreate(&launch.stop); error != cudaSuccess) {
      (void)cudaEventDestroy(launch.start);
      return CudaStatus(error, "profile event");
    }
    timed_->push_back(launch);
    CKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(launch.start, stream_), what);
    return absl::OkStatus();
  }

  absl::Status End(const char* what) {
    if (timed_ != nullptr) {
      CKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(timed_->back().stop, stream_), what);
    }
    if (!sync_) return absl::OkStatus();
    CKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), what);
    return absl::OkStatus();
  }

  const LayerBatch& batch_;
  BatchArrays arrays_;
  cudaStream_t stream_;
  void* sort_scratch_;
  size_t sort_bytes_;
  bool sync_;
  std::vector<TimedLaunch>* timed_;
};

}  // namespace

absl::Status CudaBlock::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return absl::OkStatus();
  Release();
  const size_t mib = size_t{1} << 20;
  const size_t rounded = (bytes + mib - 1) / mib * mib + mib;
  const cudaError_t error = pinned_ ? cudaMallocHost(&data_, rounded) : cudaMalloc(&data_, rounded);
  if (error != cudaSuccess) {
    data_ = nullptr;
    (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
    return CudaStatus(error, pinned_ ? "pinned host buffer" : "device buffer");
  }
  capacity_ = rounded;
  return absl::OkStatus();
}

void CudaBlock::Release() {
  if (data_ == nullptr) return;
  if (pinned_) {
    (void)cudaFreeHost(data_);
  } else {
    (void)cudaFree(data_);
  }
  data_ = nullptr;
  capacity_ = 0;
}

StreamWorker::~StreamWorker() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status StreamWorker::Init(int32_t device, MatchKernel match) {
  device_ = device;
  match_ = match;
  CKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "set device");
  CKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                           "create stream");
  return absl::OkStatus();
}

absl::Status StreamWorker::Run(std::span<const BatchJob> jobs) {
  CKV_RETURN_IF_ERROR(Prepare(jobs));
  CKV_RETURN_IF_ERROR(Upload());
  CKV_RETURN_IF_ERROR(Compute());
  return Finish();
}

absl::Status StreamWorker::Prepare(std::span<const BatchJob> jobs) {
  batch_.reset();
  CKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "set device");
  CKV_ASSIGN_OR_RETURN(LayerBatch batch, LayerBatch::Create(jobs, match_));
  const WorkspaceSizes& sizes = batch.sizes();
  CKV_CUDA_RETURN_IF_ERROR(SegmentedSortScratchBytes(batch.params(), &sort_bytes_),
                           "segmented sort scratch size");
  CKV_RETURN_IF_ERROR(d_input_.Reserve(sizes.input));
  CKV_RETURN_IF_ERROR(d_work_.Reserve(sizes.work));
  CKV_RETURN_IF_ERROR(d_small_.Reserve(sizes.small_out));
  CKV_RETURN_IF_ERROR(d_owner_.Reserve(sizes.owner));
  CKV_RETURN_IF_ERROR(d_packed_.Reserve(sizes.packed));
  CKV_RETURN_IF_ERROR(d_sort_.Reserve(sort_bytes_));
  CKV_RETURN_IF_ERROR(h_input_.Reserve(sizes.input));
  CKV_RETURN_IF_ERROR(h_small_.Reserve(sizes.small_out));
  CKV_RETURN_IF_ERROR(h_owner_.Reserve(sizes.owner));
  CKV_RETURN_IF_ERROR(h_packed_.Reserve(sizes.packed));
  batch_.emplace(std::move(batch));
  return absl::OkStatus();
}

absl::Status StreamWorker::Upload() {
  batch_->StageInputs(h_input_.data());
  CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_input_.data(), h_input_.data(), batch_->sizes().input,
                                           cudaMemcpyHostToDevice, stream_),
                           "upload");
  return absl::OkStatus();
}

absl::Status StreamWorker::Compute() {
  const BatchArrays arrays = batch_->Carve(d_input_.data(), d_work_.data(), d_small_.data(),
                                           d_owner_.data(), d_packed_.data());
  DeviceExecutor exec(*batch_, arrays, stream_, d_sort_.data(), sort_bytes_);
  return RunBatchStages(*batch_, exec);
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> StreamWorker::ProfileCompute() {
  const BatchArrays arrays = batch_->Carve(d_input_.data(), d_work_.data(), d_small_.data(),
                                           d_owner_.data(), d_packed_.data());
  std::vector<TimedLaunch> timed;
  DeviceExecutor exec(*batch_, arrays, stream_, d_sort_.data(), sort_bytes_, &timed);
  absl::Status status = RunBatchStages(*batch_, exec);
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "profile");
  std::vector<std::pair<std::string, double>> totals;  // in first-launch order
  for (const TimedLaunch& launch : timed) {
    float ms = 0.0f;
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, launch.start, launch.stop),
                                         "profile elapsed time");
    auto at = std::find_if(totals.begin(), totals.end(),
                           [&](const auto& entry) { return entry.first == launch.stage; });
    if (at == totals.end()) at = totals.insert(totals.end(), {launch.stage, 0.0});
    at->second += ms / 1e3;
    (void)cudaEventDestroy(launch.start);
    (void)cudaEventDestroy(launch.stop);
  }
  if (!status.ok()) return status;
  return totals;
}

absl::Status StreamWorker::Finish() {
  const WorkspaceSizes& sizes = batch_->sizes();
  CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_small_.data(), d_small_.data(), sizes.small_out,
                                           cudaMemcpyDeviceToHost, stream_),
                           "download lengths");
  CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_owner_.data(), d_owner_.data(), sizes.owner,
                                           cudaMemcpyDeviceToHost, stream_),
                           "download assignment");
  CKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "compress");
  const int64_t rows = batch_->PackedRows(h_small_.data());
  for (const auto& [offset, bytes] : batch_->PackedRanges(rows)) {
    CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_packed_.bytes() + offset, d_packed_.bytes() + offset,
                                             bytes, cudaMemcpyDeviceToHost, stream_),
                             "download result");
  }
  CKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "download result");
  batch_->ExtractResults(h_small_.data(), static_cast<const int32_t*>(h_owner_.data()),
                         h_packed_.data());
  return absl::OkStatus();
}

}  // namespace centroidkv::cuda
