// CudaEngine: the job queue, the batching workers and their CUDA resources. Host C++ only:
// device code is reached through the launchers of layer_kernels.h.
#include "centroidkv/kernels/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"
#include "kernels/cuda/layer_batch.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_worker.h"

namespace centroidkv::cuda {
namespace {

int64_t InputBytes(const LayerView& layer) {
  return static_cast<int64_t>(layer.num_heads) * layer.num_tokens *
         (layer.key_dim + layer.value_dim) * DTypeSize(layer.dtype);
}

}  // namespace

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
      CKV_RETURN_IF_ERROR(worker->Init(
          options_.device, options_.tensor_core_match ? MatchKernel::kTiles : MatchKernel::kWarp));
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
  if (const char* match = std::getenv("CKV_CUDA_MATCH"); match != nullptr) {
    options.tensor_core_match = std::string_view(match) != "warp";
  }
  std::unique_ptr<CudaEngine> engine(new CudaEngine(limits, std::move(device)));
  engine->impl_ = std::make_unique<Impl>(options);
  CKV_RETURN_IF_ERROR(engine->impl_->Start());
  return engine;
}

absl::Status CudaEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                      const CompressControl& control, CompressResult* out) const {
  return impl_->Compress(BatchJob{&plan, &layer, out}, control);
}

}  // namespace centroidkv::cuda
