// CudaEngine beyond the conformance suite (which runs every case on it): construction
// without a device, and concurrent callers whose jobs the workers batch together, each
// getting exactly the reference engine's result. Cases that need a device skip with
// "no CUDA device: ..." where there is none.
#include "centroidkv/kernels/gpu/cuda_engine.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/reference_engine.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::gpu {
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
  CompressOptions compress;
  compress.chunk_size = 32;
  compress.sink_tokens = 4;
  compress.recent_tokens = 8;
  compress.target_ratio = 0.3;
  compress.min_similarity = 0.2;
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

}  // namespace
}  // namespace centroidkv::gpu
