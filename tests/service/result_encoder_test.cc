// ResultEncoder: header then slabs in order, sizes add up, fp16 output rounds once, and
// the result goes back to its pool as soon as the last slab holds its copy.
#include "service/result_encoder.h"

#include <gtest/gtest.h>

#include <cstring>

namespace centroidkv::service {
namespace {

CompressResult MakeResult(int64_t rows, int32_t key_dim, int32_t value_dim) {
  CompressResult result;
  result.num_heads = 1;
  result.num_tokens = static_cast<int32_t>(rows * 2);
  result.key_dim = key_dim;
  result.value_dim = value_dim;
  result.offsets = {0, rows};
  for (int64_t i = 0; i < rows * key_dim; ++i) result.keys.push_back(0.001f * i + 1.0f / 3);
  for (int64_t i = 0; i < rows * value_dim; ++i) result.values.push_back(-0.5f * i);
  for (int64_t i = 0; i < rows; ++i) result.counts.push_back(2);
  for (int64_t i = 0; i < rows * 2; ++i) result.assignment.push_back(static_cast<int32_t>(i / 2));
  return result;
}

// A result owned by no pool (deleted when the encoder is done with it).
PooledResult Unpooled(CompressResult result) {
  return PooledResult(new CompressResult(std::move(result)));
}

TEST(ResultEncoderTest, HeaderThenOrderedSlabsCoveringEveryByte) {
  const CompressResult result = MakeResult(1000, 16, 8);
  ResultEncoder encoder(77, 3, DType::kFloat32, ResultProvenance{"reference"}, Unpooled(result), 4096);
  v1::CompressResponse message;
  ASSERT_TRUE(encoder.Next(&message));
  ASSERT_TRUE(message.has_result());
  const v1::JobResult header = message.result();
  EXPECT_EQ(header.job_id(), 77u);
  EXPECT_EQ(header.layer_index(), 3u);
  EXPECT_EQ(header.out_keys_bytes(), 1000u * 16 * 4);
  EXPECT_EQ(header.assignment_bytes(), 2000u * 4);

  std::vector<uint8_t> keys;
  std::vector<uint8_t> assignment;
  v1::Tensor last = v1::TENSOR_UNSPECIFIED;
  while (encoder.Next(&message)) {
    ASSERT_TRUE(message.has_slab());
    const v1::TensorSlab& slab = message.slab();
    EXPECT_EQ(slab.job_id(), 77u);
    EXPECT_LE(slab.data().size(), 4096u);
    EXPECT_GE(slab.tensor(), last) << "tensors come in a fixed order";
    last = slab.tensor();
    std::vector<uint8_t>* target = slab.tensor() == v1::TENSOR_OUT_KEYS     ? &keys
                                   : slab.tensor() == v1::TENSOR_ASSIGNMENT ? &assignment
                                                                            : nullptr;
    if (target != nullptr) {
      EXPECT_EQ(slab.byte_offset(), target->size());
      target->insert(target->end(), slab.data().begin(), slab.data().end());
    }
  }
  ASSERT_EQ(keys.size(), result.keys.size() * 4);
  EXPECT_EQ(std::memcmp(keys.data(), result.keys.data(), keys.size()), 0);
  ASSERT_EQ(assignment.size(), result.assignment.size() * 4);
  EXPECT_EQ(std::memcmp(assignment.data(), result.assignment.data(), assignment.size()), 0);
}

TEST(ResultEncoderTest, Float16OutputIsTheFloat32ResultRoundedOnce) {
  const CompressResult result = MakeResult(10, 4, 4);
  ResultEncoder encoder(1, 0, DType::kFloat16, ResultProvenance{"reference"}, Unpooled(result), 1 << 20);
  v1::CompressResponse message;
  ASSERT_TRUE(encoder.Next(&message));
  EXPECT_EQ(message.result().dtype(), v1::DTYPE_FLOAT16);
  ASSERT_TRUE(encoder.Next(&message));
  ASSERT_EQ(message.slab().tensor(), v1::TENSOR_OUT_KEYS);
  const auto* halves = reinterpret_cast<const uint16_t*>(message.slab().data().data());
  ASSERT_EQ(message.slab().data().size(), result.keys.size() * 2);
  for (size_t i = 0; i < result.keys.size(); ++i) {
    EXPECT_EQ(halves[i], FloatToHalf(result.keys[i])) << "element " << i;
  }
}

// Every slab's bytes, tensor by tensor, in order.
std::vector<std::string> EncodedTensors(ResultEncoder& encoder) {
  std::vector<std::string> tensors(8);
  v1::CompressResponse message;
  EXPECT_TRUE(encoder.Next(&message));
  while (encoder.Next(&message)) {
    EXPECT_TRUE(message.has_slab());
    tensors[message.slab().tensor()] += message.slab().data();
  }
  return tensors;
}

// An engine that wrote the rows in the output dtype (CompressOptions::result_dtype): its
// half rows go out as they are, byte for byte what rounding the float32 rows gives, in slabs
// that split them anywhere.
TEST(ResultEncoderTest, RowsAlreadyInTheOutputDTypeGoOutUnchanged) {
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const CompressResult floats = MakeResult(300, 12, 6);
    CompressResult halves = floats;
    RoundResultRows(dtype, &halves);
    ASSERT_TRUE(halves.keys.empty());
    ResultEncoder from_floats(1, 0, dtype, ResultProvenance{"cpu"}, Unpooled(floats), 1000);
    ResultEncoder from_halves(1, 0, dtype, ResultProvenance{"cuda:0"}, Unpooled(halves), 1000);
    const std::vector<std::string> expected = EncodedTensors(from_floats);
    const std::vector<std::string> actual = EncodedTensors(from_halves);
    ASSERT_EQ(expected[v1::TENSOR_OUT_KEYS].size(), 300u * 12 * 2);
    EXPECT_EQ(actual, expected);
  }
}

TEST(ResultEncoderTest, NoAssignmentWhenNotComputed) {
  CompressResult result = MakeResult(5, 2, 2);
  result.assignment.clear();
  ResultEncoder encoder(1, 0, DType::kFloat32, ResultProvenance{"reference"}, Unpooled(result), 1 << 20);
  v1::CompressResponse message;
  ASSERT_TRUE(encoder.Next(&message));
  EXPECT_FALSE(message.result().has_assignment());
  while (encoder.Next(&message)) EXPECT_NE(message.slab().tensor(), v1::TENSOR_ASSIGNMENT);
}

TEST(ResultEncoderTest, ReturnsTheResultToItsPoolWithTheLastSlab) {
  auto pool = ResultPool::Create({4, uint64_t{1} << 30});
  PooledResult leased = pool->Acquire(0);
  *leased = MakeResult(300, 8, 8);
  const uint64_t bytes = ResultPool::CapacityBytes(*leased);
  ResultEncoder encoder(5, 0, DType::kFloat32, ResultProvenance{"reference"}, std::move(leased), 1024);
  v1::CompressResponse message;
  int64_t messages = 0;
  while (encoder.holds_result()) {
    EXPECT_EQ(pool->stats().leased, 1) << "returned before message " << messages;
    ASSERT_TRUE(encoder.Next(&message));
    ++messages;
  }
  // The last message was produced (its slab holds the data) and the result is back.
  EXPECT_TRUE(message.has_slab());
  EXPECT_EQ(message.slab().tensor(), v1::TENSOR_ASSIGNMENT);
  EXPECT_EQ(message.slab().byte_offset() + message.slab().data().size(), 600u * 4);
  EXPECT_EQ(messages, 1 + (300 * 8 * 4 + 1023) / 1024 * 2 + (300 * 4 + 1023) / 1024 +
                          (600 * 4 + 1023) / 1024);
  EXPECT_FALSE(encoder.Next(&message));
  const ResultPool::Stats stats = pool->stats();
  EXPECT_EQ(stats.leased, 0);
  EXPECT_EQ(stats.idle_results, 1);
  EXPECT_EQ(stats.idle_bytes, bytes);
}

}  // namespace
}  // namespace centroidkv::service
