// CudaEngine: the job queue, the batching workers and their CUDA resources. Host C++ only:
// device code is reached through the launchers of layer_kernels.h.
#include "centroidkv/kernels/gpu/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"
#include "kernels/gpu/cuda_status.h"
#include "kernels/gpu/layer_batch.h"
#include "kernels/gpu/layer_kernels.h"

namespace centroidkv::gpu {
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
    case StageId::kPack: return "pack";
  }
  return "stage";
}

// CKV_CUDA_SYNC_EACH_STAGE=1: wait for every launch (pins an error on its stage; slow).
bool SyncEachStage() {
  const char* value = std::getenv("CKV_CUDA_SYNC_EACH_STAGE");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// A device (or pinned host) block that grows on demand and is reused across batches.
class Block {
 public:
  explicit Block(bool pinned) : pinned_(pinned) {}
  ~Block() { Release(); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    Release();
    const size_t rounded = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
    const cudaError_t error =
        pinned_ ? cudaMallocHost(&data_, rounded) : cudaMalloc(&data_, rounded);
    if (error != cudaSuccess) {
      data_ = nullptr;
      (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
      return CudaStatus(error, pinned_ ? "pinned host buffer" : "device buffer");
    }
    capacity_ = rounded;
    return absl::OkStatus();
  }
  void* data() const { return data_; }
  char* bytes() const { return static_cast<char*>(data_); }

 private:
  void Release() {
    if (data_ == nullptr) return;
    if (pinned_) {
      (void)cudaFreeHost(data_);
    } else {
      (void)cudaFree(data_);
    }
    data_ = nullptr;
    capacity_ = 0;
  }

  bool pinned_;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Runs the stages of one batch on a stream (the executor of RunBatchStages).
class DeviceExecutor {
 public:
  DeviceExecutor(const LayerBatch& batch, const BatchArrays& arrays, cudaStream_t stream,
                 void* sort_scratch, size_t sort_bytes)
      : batch_(batch), arrays_(arrays), stream_(stream), sort_scratch_(sort_scratch),
        sort_bytes_(sort_bytes), sync_(SyncEachStage()) {}

  absl::Status Stage(StageId id, int64_t items, const PassArgs& pass) {
    CKV_CUDA_RETURN_IF_ERROR(LaunchStage(id, batch_.params(), arrays_, pass, items, stream_),
                             StageName(id));
    return MaybeSync(StageName(id));
  }

  absl::Status Sort() {
    CKV_CUDA_RETURN_IF_ERROR(
        LaunchSegmentedSort(batch_.params(), arrays_, sort_scratch_, sort_bytes_, stream_),
        "segmented sort");
    return MaybeSync("segmented sort");
  }

 private:
  absl::Status MaybeSync(const char* what) {
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
};

int64_t InputBytes(const LayerView& layer) {
  return static_cast<int64_t>(layer.num_heads) * layer.num_tokens *
         (layer.key_dim + layer.value_dim) * DTypeSize(layer.dtype);
}

}  // namespace

// One stream with its buffers. Used by one worker thread at a time.
class StreamWorker {
 public:
  StreamWorker() = default;
  ~StreamWorker() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  absl::Status Init(int32_t device) {
    device_ = device;
    CKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "set device");
    CKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                             "create stream");
    return absl::OkStatus();
  }

  // Runs the jobs (which CanBatch together) as one batch and fills their results.
  absl::Status Run(std::span<const BatchJob> jobs) {
    CKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "set device");
    CKV_ASSIGN_OR_RETURN(LayerBatch batch, LayerBatch::Create(jobs));
    const WorkspaceSizes& sizes = batch.sizes();
    size_t sort_bytes = 0;
    CKV_CUDA_RETURN_IF_ERROR(SegmentedSortScratchBytes(batch.params(), &sort_bytes),
                             "segmented sort scratch size");
    CKV_RETURN_IF_ERROR(d_input_.Reserve(sizes.input));
    CKV_RETURN_IF_ERROR(d_work_.Reserve(sizes.work));
    CKV_RETURN_IF_ERROR(d_small_.Reserve(sizes.small_out));
    CKV_RETURN_IF_ERROR(d_owner_.Reserve(sizes.owner));
    CKV_RETURN_IF_ERROR(d_packed_.Reserve(sizes.packed));
    CKV_RETURN_IF_ERROR(d_sort_.Reserve(sort_bytes + 256));
    CKV_RETURN_IF_ERROR(h_input_.Reserve(sizes.input));
    CKV_RETURN_IF_ERROR(h_small_.Reserve(sizes.small_out));
    CKV_RETURN_IF_ERROR(h_owner_.Reserve(sizes.owner));
    CKV_RETURN_IF_ERROR(h_packed_.Reserve(sizes.packed));

    batch.StageInputs(h_input_.data());
    CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_input_.data(), h_input_.data(), sizes.input,
                                             cudaMemcpyHostToDevice, stream_),
                             "upload");
    const BatchArrays arrays = batch.Carve(d_input_.data(), d_work_.data(), d_small_.data(),
                                           d_owner_.data(), d_packed_.data());
    DeviceExecutor exec(batch, arrays, stream_, d_sort_.data(), sort_bytes);
    CKV_RETURN_IF_ERROR(RunBatchStages(batch, exec));
    CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_small_.data(), d_small_.data(), sizes.small_out,
                                             cudaMemcpyDeviceToHost, stream_),
                             "download lengths");
    CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_owner_.data(), d_owner_.data(), sizes.owner,
                                             cudaMemcpyDeviceToHost, stream_),
                             "download assignment");
    CKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "compress");
    const int64_t rows = batch.PackedRows(h_small_.data());
    for (const auto& [offset, bytes] : batch.PackedRanges(rows)) {
      CKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h_packed_.bytes() + offset, d_packed_.bytes() + offset,
                                               bytes, cudaMemcpyDeviceToHost, stream_),
                               "download result");
    }
    CKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "download result");
    batch.ExtractResults(h_small_.data(), static_cast<const int32_t*>(h_owner_.data()),
                         h_packed_.data());
    return absl::OkStatus();
  }

 private:
  int32_t device_ = 0;
  cudaStream_t stream_ = nullptr;
  Block d_input_{false}, d_work_{false}, d_small_{false}, d_owner_{false}, d_packed_{false},
      d_sort_{false};
  Block h_input_{true}, h_small_{true}, h_owner_{true}, h_packed_{true};
};

class CudaEngine::Impl {
 public:
  explicit Impl(CudaEngineOptions options) : options_(options) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  absl::Status Start() {
    for (int32_t i = 0; i < std::max(options_.workers, 1); ++i) {
      auto worker = std::make_unique<StreamWorker>();
      CKV_RETURN_IF_ERROR(worker->Init(options_.device));
      workers_.push_back(std::move(worker));
    }
    for (auto& worker : workers_) {
      threads_.emplace_back([this, w = worker.get()] { Loop(*w); });
    }
    return absl::OkStatus();
  }

  absl::Status Compress(const BatchJob& job, const CompressControl& control) {
    Request request{job, &control, absl::OkStatus(), false};
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(&request);
    }
    work_cv_.notify_one();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return request.done; });
    return request.status;
  }

 private:
  struct Request {
    BatchJob job;
    const CompressControl* control;
    absl::Status status;
    bool done = false;
  };

  // Takes the first queued job and every queued job that batches with it.
  std::vector<Request*> TakeBatch() {
    std::vector<Request*> batch{queue_.front()};
    queue_.pop_front();
    int64_t bytes = InputBytes(*batch[0]->job.layer);
    for (auto it = queue_.begin(); it != queue_.end();) {
      const int64_t more = InputBytes(*(*it)->job.layer);
      if (static_cast<int32_t>(batch.size()) < options_.max_batch_jobs &&
          bytes + more <= options_.max_batch_input_bytes && CanBatch(batch[0]->job, (*it)->job)) {
        bytes += more;
        batch.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  void Loop(StreamWorker& worker) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      std::vector<Request*> batch = TakeBatch();
      lock.unlock();
      RunBatch(worker, batch);
      lock.lock();
      for (Request* request : batch) request->done = true;
      done_cv_.notify_all();
    }
  }

  static void RunBatch(StreamWorker& worker, const std::vector<Request*>& batch) {
    std::vector<Request*> live;
    std::vector<BatchJob> jobs;
    for (Request* request : batch) {
      if (request->control->IsCancelled()) {
        request->status = absl::CancelledError("job cancelled");
        continue;
      }
      live.push_back(request);
      jobs.push_back(request->job);
    }
    if (jobs.empty()) return;
    absl::Status status = worker.Run(jobs);
    if (absl::IsResourceExhausted(status) && jobs.size() > 1) {
      // Too big together: each job on its own, so only a job that cannot fit fails.
      for (Request* request : live) request->status = worker.Run({&request->job, 1});
      return;
    }
    for (Request* request : live) request->status = status;
  }

  CudaEngineOptions options_;
  std::vector<std::unique_ptr<StreamWorker>> workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Request*> queue_;
  bool stop_ = false;
};

CudaEngine::CudaEngine(EngineLimits limits, DeviceInfo device)
    : ClusterEngine(limits), device_(std::move(device)) {}

CudaEngine::~CudaEngine() = default;

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(EngineLimits limits,
                                                               CudaEngineOptions options) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", CudaStatus(error, "device count").message()));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: device ", options.device, " requested, ", count, " present"));
  }
  cudaDeviceProp props{};
  CKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, options.device), "device properties");
  DeviceInfo device{absl::StrCat("cuda:", options.device), props.name,
                    static_cast<int64_t>(props.totalGlobalMem), props.major, props.minor};
  std::unique_ptr<CudaEngine> engine(new CudaEngine(limits, std::move(device)));
  engine->impl_ = std::make_unique<Impl>(options);
  CKV_RETURN_IF_ERROR(engine->impl_->Start());
  return engine;
}

absl::Status CudaEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                      const CompressControl& control, CompressResult* out) const {
  return impl_->Compress(BatchJob{&plan, &layer, out}, control);
}

}  // namespace centroidkv::gpu
