#include "bench/faiss_peer.h"

#include <dlfcn.h>
#include <faiss/IndexFlat.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "centroidkv/common/dtype.h"

namespace centroidkv::bench {

struct FaissMatcher::Task {
  int32_t head = 0;
  ChunkSpan chunk;
  int64_t first_source = 0;  // index of the task's first row in queries_ / labels_
  std::unique_ptr<faiss::IndexFlatIP> index;
};

namespace {

// Widens one fp16 row and scales it to unit length as SPEC's cosine does (max(|x|, 1e-6)).
void NormalisedRow(const uint16_t* row, int32_t dim, float* out) {
  double norm = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    out[j] = HalfToFloat(row[j]);
    norm += static_cast<double>(out[j]) * out[j];
  }
  const float scale = static_cast<float>(1.0 / std::max(std::sqrt(norm), 1e-6));
  for (int32_t j = 0; j < dim; ++j) out[j] *= scale;
}

// OpenBLAS has its own thread pool besides OpenMP's; set it when that BLAS is the one loaded
// (the reference BLAS has no threads and no such function).
void SetBlasThreads(int32_t threads) {
  using SetThreads = void (*)(int);
  if (auto* set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
}

}  // namespace

std::string_view FaissThreadingName(FaissThreading threading) {
  return threading == FaissThreading::kInternal ? "internal" : "over_chunks";
}

FaissMatcher::FaissMatcher(const Workload& workload, const std::vector<ChunkSpan>& chunks)
    : dim_(workload.spec.dim) {
  const WorkloadSpec& spec = workload.spec;
  std::vector<float> row(dim_);
  std::vector<float> destinations;
  for (int32_t h = 0; h < spec.heads; ++h) {
    const uint16_t* keys = &workload.keys[static_cast<size_t>(h) * spec.tokens * dim_];
    for (const ChunkSpan& chunk : chunks) {
      Task task;
      task.head = h;
      task.chunk = chunk;
      task.first_source = num_sources();
      destinations.assign(static_cast<size_t>(chunk.destinations()) * dim_, 0.0f);
      for (int32_t offset = 0; offset < chunk.length; ++offset) {
        const int32_t token = chunk.begin + offset;
        NormalisedRow(keys + static_cast<size_t>(token) * dim_, dim_, row.data());
        if (offset % 2 == 0) {
          queries_.insert(queries_.end(), row.begin(), row.end());
          source_tokens_.push_back(token);
          source_heads_.push_back(h);
          source_chunk_begin_.push_back(chunk.begin);
        } else {
          std::copy(row.begin(), row.end(), &destinations[static_cast<size_t>(offset / 2) * dim_]);
        }
      }
      task.index = std::make_unique<faiss::IndexFlatIP>(dim_);
      task.index->add(chunk.destinations(), destinations.data());
      tasks_.push_back(std::move(task));
    }
  }
  labels_.assign(source_tokens_.size(), -1);
  scores_.assign(source_tokens_.size(), 0.0f);
}

FaissMatcher::~FaissMatcher() = default;

int64_t FaissMatcher::DestinationToken(int64_t i) const {
  // FAISS labels index the B half of the chunk: offset 2 * label + 1 from its start.
  return labels_[i] < 0 ? -1 : source_chunk_begin_[i] + 2 * labels_[i] + 1;
}

void FaissMatcher::ConfigureThreads(FaissThreading threading, int32_t threads) {
  omp_set_num_threads(threads);
  SetBlasThreads(threading == FaissThreading::kInternal ? threads : 1);
}

void FaissMatcher::Match(FaissThreading threading, int32_t threads) {
  const int64_t num_tasks = static_cast<int64_t>(tasks_.size());
  auto search = [this](const Task& task) {
    if (task.chunk.destinations() == 0) return;
    task.index->search(task.chunk.sources(), &queries_[task.first_source * dim_], 1,
                       &scores_[task.first_source], &labels_[task.first_source]);
  };
  if (threading == FaissThreading::kInternal) {
    for (int64_t i = 0; i < num_tasks; ++i) search(tasks_[i]);
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t i = 0; i < num_tasks; ++i) search(tasks_[i]);
  }
}

}  // namespace centroidkv::bench
