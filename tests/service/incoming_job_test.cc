// IncomingJob: StartJob validation and in-order slab assembly, without a network.
#include "service/incoming_job.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

test::RandomLayer Layer(DType dtype, TensorLayout layout) {
  test::RandomLayerSpec spec;
  spec.num_heads = 3;
  spec.num_tokens = 20;
  spec.key_dim = 8;
  spec.value_dim = 4;
  spec.dtype = dtype;
  spec.layout = layout;
  spec.with_counts = true;
  return test::RandomLayer::Generate(spec);
}

TEST(IncomingJobTest, ReusesTheInputBuffersOfAFinishedJobOfTheSameShape) {
  test::RandomLayerSpec spec;
  spec.num_heads = 2;
  spec.num_tokens = 2048;
  spec.key_dim = 128;  // 1 MiB of float32 keys and of values: big enough to be pooled
  spec.value_dim = 128;
  spec.dtype = DType::kFloat32;
  test::RandomLayer layer = test::RandomLayer::Generate(spec);
  const v1::StartJob start = StartJobRequest(1, layer.view(), CompressOptions{}).start_job();
  auto inputs = InputPool::Create({});  // the server's pool (ServiceContext::inputs)
  auto first = IncomingJob::Create(start, ServerOptions{}, inputs.get());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->view().keys, nullptr) << "nothing is allocated before admission";
  (*first)->AllocateInput();
  const void* keys = (*first)->view().keys;
  const void* values = (*first)->view().values;
  first->reset();
  EXPECT_EQ(inputs->stats().idle_bytes, 2 * testing::KeyBytes(layer.view()));
  auto second = IncomingJob::Create(start, ServerOptions{}, inputs.get());
  ASSERT_TRUE(second.ok()) << second.status();
  (*second)->AllocateInput();
  const void* reused[] = {keys, values};
  EXPECT_TRUE((*second)->view().keys == reused[0] || (*second)->view().keys == reused[1]);
  EXPECT_TRUE((*second)->view().values == reused[0] || (*second)->view().values == reused[1]);
  EXPECT_NE((*second)->view().keys, (*second)->view().values);
  // The reused bytes are filled by the slabs as before.
  ASSERT_TRUE((*second)
                  ->AddSlab(SlabRequest(1, v1::TENSOR_KEYS, 0, layer.view().keys,
                                        testing::KeyBytes(layer.view())).slab())
                  .ok());
  ASSERT_TRUE((*second)
                  ->AddSlab(SlabRequest(1, v1::TENSOR_VALUES, 0, layer.view().values,
                                        testing::ValueBytes(layer.view())).slab())
                  .ok());
  ASSERT_TRUE((*second)->complete());
  EXPECT_EQ(std::memcmp((*second)->view().keys, layer.view().keys,
                        testing::KeyBytes(layer.view())), 0);
}

TEST(IncomingJobTest, AssemblesSlabsIntoTheSameBytes) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (TensorLayout layout : {TensorLayout::kHeadMajor, TensorLayout::kTokenMajor}) {
      test::RandomLayer layer = Layer(dtype, layout);
      const LayerView view = layer.view();
      auto job = IncomingJob::Create(StartJobRequest(9, view, CompressOptions{}).start_job(),
                                     ServerOptions{});
      ASSERT_TRUE(job.ok()) << job.status();
      const uint64_t key_bytes = testing::KeyBytes(view);
      // Keys in uneven slabs; values and counts whole.
      for (uint64_t offset = 0; offset < key_bytes; offset += 37) {
        const size_t length = static_cast<size_t>(std::min<uint64_t>(37, key_bytes - offset));
        ASSERT_TRUE((*job)
                        ->AddSlab(SlabRequest(9, v1::TENSOR_KEYS, offset,
                                              static_cast<const char*>(view.keys) + offset, length)
                                      .slab())
                        .ok());
        EXPECT_FALSE((*job)->complete());
      }
      ASSERT_TRUE((*job)->AddSlab(SlabRequest(9, v1::TENSOR_VALUES, 0, view.values,
                                              testing::ValueBytes(view)).slab()).ok());
      EXPECT_FALSE((*job)->complete()) << "counts are still missing";
      ASSERT_TRUE((*job)->AddSlab(SlabRequest(9, v1::TENSOR_COUNTS, 0, view.counts,
                                              testing::CountBytes(view)).slab()).ok());
      ASSERT_TRUE((*job)->complete());
      const LayerView& got = (*job)->view();
      EXPECT_EQ(got.dtype, dtype);
      EXPECT_EQ(got.layout, layout);
      EXPECT_EQ(std::memcmp(got.keys, view.keys, key_bytes), 0);
      EXPECT_EQ(std::memcmp(got.values, view.values, testing::ValueBytes(view)), 0);
      EXPECT_EQ(std::memcmp(got.counts, view.counts, testing::CountBytes(view)), 0);
    }
  }
}

TEST(IncomingJobTest, FootprintCoversInputAndLargestResult) {
  test::RandomLayer layer = Layer(DType::kFloat16, TensorLayout::kHeadMajor);
  v1::StartJob start = StartJobRequest(1, layer.view(), CompressOptions{}).start_job();
  start.set_output_dtype(v1::DTYPE_FLOAT32);
  start.set_return_assignment(true);
  auto job = IncomingJob::Create(start, ServerOptions{});
  ASSERT_TRUE(job.ok());
  const uint64_t rows = 3 * 20;
  const uint64_t input = rows * (8 + 4) * 2 + rows * 4;
  const uint64_t result = rows * (8 + 4) * 4 + rows * 4 + rows * 4;
  EXPECT_EQ((*job)->footprint_bytes(), input + result);
}

TEST(IncomingJobTest, ParametersAreCheckedWhenTheJobIsAnnounced) {
  test::RandomLayer layer = Layer(DType::kFloat32, TensorLayout::kHeadMajor);
  CompressOptions options;
  options.chunk_size = 1;
  auto job = IncomingJob::Create(StartJobRequest(1, layer.view(), options).start_job(),
                                 ServerOptions{});
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("chunk_size"), absl::string_view::npos);
}

TEST(IncomingJobTest, OutputDtypeDefaultsToInputDtype) {
  test::RandomLayer layer = Layer(DType::kBFloat16, TensorLayout::kHeadMajor);
  v1::StartJob start = StartJobRequest(1, layer.view(), CompressOptions{}).start_job();
  start.clear_output_dtype();
  auto job = IncomingJob::Create(start, ServerOptions{});
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)->output_dtype(), DType::kBFloat16);
}

}  // namespace
}  // namespace centroidkv::service::testing
