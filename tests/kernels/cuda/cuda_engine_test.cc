// CudaEngine beyond the conformance suite (which runs every case on it): construction
// without a device, concurrent callers whose jobs the workers batch together, each getting
// exactly the reference engine's result, and the tensor-core match kernel on its own (its
// near-tie lists, read back from the device, hold every source's exact best). Cases that
// need a device skip with "no CUDA device: ..." where there is none.
#include "centroidkv/kernels/cuda/cuda_engine.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"
#include "kernels/cuda/layer_kernels.h"
#include "kernels/reference/reference_engine.h"
#include "tests/kernels/cuda/staged_job.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::cuda {
namespace {

TEST(CudaEngineTest, AMissingDeviceIsFailedPrecondition) {
  CudaEngineOptions options;
  options.device = 1000;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine = CudaEngine::Create({}, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "no CUDA device", std::string(engine.status().message()));
}

TEST(CudaEngineTest, ConcurrentJobsBatchAndMatchTheReferenceExactly) {
  CudaEngineOptions options;
  options.workers = 2;
  options.max_batch_jobs = 4;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine = CudaEngine::Create({}, options);
  if (!engine.ok()) GTEST_SKIP() << "no CUDA device: " << engine.status();
  EXPECT_EQ((*engine)->name(), "cuda:0");
  EXPECT_GE((*engine)->device().compute_major, 8);

  constexpr int kJobs = 12;
  CompressOptions compress{.target_ratio = 0.3, .chunk_size = 32, .sink_tokens = 4,
      .recent_tokens = 8, .min_similarity = 0.2};
  std::vector<test::RandomLayer> layers;
  for (int i = 0; i < kJobs; ++i) {
    test::RandomLayerSpec spec;
    spec.num_heads = 4;
    spec.num_tokens = 700;
    spec.key_dim = 64;
    spec.value_dim = 32;
    spec.dtype = DType::kFloat16;
    spec.with_counts = i % 2 == 0;
    spec.prototypes = 3 + i % 5;
    spec.noise = 0.3;
    spec.seed = 100 + i;
    layers.push_back(test::RandomLayer::Generate(spec));
  }
  std::vector<absl::StatusOr<CompressResult>> results(kJobs);
  std::vector<std::thread> threads;
  for (int i = 0; i < kJobs; ++i) {
    threads.emplace_back([&, i] { results[i] = (*engine)->Compress(layers[i].view(), compress); });
  }
  for (std::thread& thread : threads) thread.join();
  const ReferenceEngine reference;
  for (int i = 0; i < kJobs; ++i) {
    SCOPED_TRACE("job " + std::to_string(i));
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    absl::StatusOr<CompressResult> expected = reference.Compress(layers[i].view(), compress);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(results[i]->offsets, expected->offsets);
    EXPECT_EQ(results[i]->counts, expected->counts);
    EXPECT_EQ(results[i]->assignment, expected->assignment);
    EXPECT_EQ(results[i]->passes_run, expected->passes_run);
    ASSERT_EQ(results[i]->keys.size(), expected->keys.size());
    ASSERT_EQ(results[i]->values.size(), expected->values.size());
    EXPECT_EQ(std::memcmp(results[i]->keys.data(), expected->keys.data(),
                          expected->keys.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(results[i]->values.data(), expected->values.data(),
                          expected->values.size() * sizeof(float)), 0);
  }
}

// Device memory for one test, freed at the end.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { ok_ = cudaMalloc(&data_, bytes) == cudaSuccess; }
  ~DeviceBuffer() {
    if (ok_) (void)cudaFree(data_);
  }
  bool ok() const { return ok_; }
  char* data() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  bool ok_ = false;
};

// kMatchTiles alone on the device: the job's staged input and work blocks go up, kInit,
// kSetup and kMatchTiles run there (WMMA, 4 warps, shared memory), and the near-tie lists
// come back into the host's work block for the same check the host tests make. Where the
// conformance suite fails on a GPU, this says whether the tile match is the stage at fault.
TEST(CudaEngineTest, TileMatchListsHoldTheExactBestOnTheDevice) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed or found none";
  }
  struct Case {
    int32_t tokens, dim;
    DType dtype;
    int32_t prototypes;
    double noise;
    int32_t chunk;
  };
  const Case cases[] = {{700, 64, DType::kFloat16, 0, 1.0, 300},    // 3 x 3 tiles per chunk
                        {600, 128, DType::kBFloat16, 4, 0.05, 256},
                        {500, 256, DType::kFloat32, 3, 1e-3, 64},   // the largest tile layout
                        {400, 36, DType::kFloat16, 1, 0.0, 64}};    // every list overflows
  for (const Case& c : cases) {
    SCOPED_TRACE("dim " + std::to_string(c.dim) + " chunk " + std::to_string(c.chunk));
    StagedJob job(TileTestKeys(c.tokens, c.dim, c.dtype, c.prototypes, c.noise, 7), c.chunk);
    const WorkspaceSizes& sizes = job.batch().sizes();
    DeviceBuffer input(sizes.input), work(sizes.work), small(sizes.small_out), owner(sizes.owner),
        packed(sizes.packed);
    ASSERT_TRUE(input.ok() && work.ok() && small.ok() && owner.ok() && packed.ok());
    ASSERT_EQ(cudaMemcpy(input.data(), job.input(), sizes.input, cudaMemcpyHostToDevice),
              cudaSuccess);
    const BatchArrays device = job.batch().Carve(input.data(), work.data(), small.data(),
                                                 owner.data(), packed.data());
    const PassArgs pass = job.batch().Pass(0);
    for (const StageId stage : {StageId::kInit, StageId::kSetup, StageId::kMatchTiles}) {
      ASSERT_EQ(LaunchStage(stage, job.params(), device, pass, job.batch().Items(stage), nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // The lists, at the same offsets of the work block, over the host's.
    const BatchArrays& host = job.arrays();
    const int64_t slots = job.params().global_heads() * job.params().slot_capacity;
    auto offset = [&](const void* at) {
      return static_cast<size_t>(static_cast<const char*>(at) - static_cast<char*>(job.work()));
    };
    ASSERT_EQ(cudaMemcpy(host.match_count, work.data() + offset(host.match_count),
                         sizeof(int32_t) * slots, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.match_ties, work.data() + offset(host.match_ties),
                         sizeof(int32_t) * slots * kMaxTies, cudaMemcpyDeviceToHost),
              cudaSuccess);
    const int overflowed = ExpectListsHoldTheExactBest(job);
    if (c.prototypes == 1 && c.noise == 0.0) {
      EXPECT_GT(overflowed, 0);
    }
  }
}

}  // namespace
}  // namespace centroidkv::cuda
