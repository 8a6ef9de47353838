// Tests of proto/slab_codec.cc: the writer and the assembler both ends use. A writer's slabs
// fed to an assembler rebuild every tensor exactly, for any slab size and tensor mix; and
// the framing rules hold whoever sends: gaps and overlaps are framing errors
// (FAILED_PRECONDITION), bytes past a tensor, an empty slab or a tensor the job does not
// have fail the job naming slab.data / slab.tensor, and short tensors are reported missing.
#include "centroidkv/wire/slab_codec.h"

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"

namespace centroidkv {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 8));
  return bytes;
}

v1::TensorSlab Slab(uint64_t job, v1::Tensor tensor, uint64_t offset, const std::string& data) {
  v1::TensorSlab slab;
  slab.set_job_id(job);
  slab.set_tensor(tensor);
  slab.set_byte_offset(offset);
  slab.set_data(data);
  return slab;
}

TEST(SlabPayloadBytesTest, HonoursTheReceiversLimitInWholeElements) {
  EXPECT_EQ(SlabPayloadBytes(256 << 10, 0), 256 << 10);
  EXPECT_EQ(SlabPayloadBytes(256 << 10, 100000), 100000);
  EXPECT_EQ(SlabPayloadBytes(256 << 10, 100001), 100000) << "a multiple of 8";
  EXPECT_EQ(SlabPayloadBytes(1001, 0), 1000);
  EXPECT_EQ(SlabPayloadBytes(3, 0), 8) << "never below one float64's worth";
  EXPECT_EQ(SlabPayloadBytes(int64_t{1} << 40, 0), INT32_MAX - INT32_MAX % 8);
}

// Writer -> assembler for slab sizes that divide the tensors evenly, unevenly, and exceed
// them; tensors of odd sizes, one empty (skipped), and bytes made while sending (`copy`).
TEST(SlabCodecTest, WriterSlabsRebuildEveryTensorThroughTheAssembler) {
  const std::vector<uint8_t> keys = Bytes(12345, 1), values = Bytes(4096, 2), counts = Bytes(0, 3);
  const std::vector<uint8_t> made = Bytes(777, 4);
  for (int32_t slab_bytes : {8, 64, 1000, 4096, 1 << 20}) {
    SCOPED_TRACE(slab_bytes);
    SlabWriter writer(
        42,
        {{v1::TENSOR_KEYS, keys.size(), keys.data(), {}},
         {v1::TENSOR_VALUES, values.size(), values.data(), {}},
         {v1::TENSOR_COUNTS, counts.size(), counts.data(), {}},
         {v1::TENSOR_ASSIGNMENT, made.size(), nullptr,
          [&made](uint64_t offset, uint64_t length, char* out) {
            std::memcpy(out, made.data() + offset, length);
          }}},
        slab_bytes);
    std::vector<uint8_t> got_keys(keys.size()), got_values(values.size()), got_made(made.size());
    SlabAssembler assembler(42, {{v1::TENSOR_KEYS, got_keys.data(), keys.size(), "keys"},
                                 {v1::TENSOR_VALUES, got_values.data(), values.size(), "values"},
                                 {v1::TENSOR_ASSIGNMENT, got_made.data(), made.size(), "assignment"}});
    v1::TensorSlab slab;
    int slabs = 0;
    v1::Tensor last = v1::TENSOR_UNSPECIFIED;
    while (writer.Next(&slab)) {
      ++slabs;
      EXPECT_EQ(slab.job_id(), 42u);
      EXPECT_LE(slab.data().size(), static_cast<size_t>(slab_bytes));
      EXPECT_NE(slab.tensor(), v1::TENSOR_COUNTS) << "an empty tensor sends no slab";
      EXPECT_GE(slab.tensor(), last) << "tensors go out in the order given";
      last = slab.tensor();
      ASSERT_TRUE(assembler.Add(slab).ok());
    }
    EXPECT_TRUE(writer.done());
    EXPECT_FALSE(writer.Next(&slab));
    EXPECT_TRUE(assembler.complete()) << assembler.MissingTensors();
    EXPECT_EQ(got_keys, keys);
    EXPECT_EQ(got_values, values);
    EXPECT_EQ(got_made, made);
    const int64_t expected = (keys.size() + slab_bytes - 1) / slab_bytes +
                             (values.size() + slab_bytes - 1) / slab_bytes +
                             (made.size() + slab_bytes - 1) / slab_bytes;
    EXPECT_EQ(slabs, expected);
  }
}

TEST(SlabCodecTest, AWriterOfEmptyTensorsIsDoneAtOnce) {
  SlabWriter writer(1, {{v1::TENSOR_KEYS, 0, nullptr, {}}}, 1024);
  v1::TensorSlab slab;
  EXPECT_TRUE(writer.done());
  EXPECT_FALSE(writer.Next(&slab));
}

class SlabAssemblerTest : public testing::Test {
 protected:
  std::vector<uint8_t> keys_ = std::vector<uint8_t>(16), values_ = std::vector<uint8_t>(8);
  SlabAssembler assembler_{7,
                           {{v1::TENSOR_KEYS, keys_.data(), keys_.size(), "keys"},
                            {v1::TENSOR_VALUES, values_.data(), values_.size(), "values"}}};
};

TEST_F(SlabAssemblerTest, AGapIsAFramingError) {
  ASSERT_TRUE(assembler_.Add(Slab(7, v1::TENSOR_KEYS, 0, std::string(4, 'a'))).ok());
  const absl::Status gap = assembler_.Add(Slab(7, v1::TENSOR_KEYS, 8, std::string(4, 'b')));
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition) << gap;
  EXPECT_NE(gap.message().find("gap"), absl::string_view::npos) << gap;
  EXPECT_NE(gap.message().find("next expected offset 4"), absl::string_view::npos) << gap;
}

TEST_F(SlabAssemblerTest, AnOverlapIsAFramingError) {
  ASSERT_TRUE(assembler_.Add(Slab(7, v1::TENSOR_KEYS, 0, std::string(8, 'a'))).ok());
  const absl::Status overlap = assembler_.Add(Slab(7, v1::TENSOR_KEYS, 4, std::string(4, 'b')));
  EXPECT_EQ(overlap.code(), absl::StatusCode::kFailedPrecondition) << overlap;
  EXPECT_NE(overlap.message().find("overlaps"), absl::string_view::npos) << overlap;
  // The bytes already received are untouched by the refused slab.
  EXPECT_EQ(std::string(keys_.begin(), keys_.begin() + 8), std::string(8, 'a'));
}

TEST_F(SlabAssemblerTest, BytesPastTheTensorFailTheJobNamingSlabData) {
  const absl::Status past = assembler_.Add(Slab(7, v1::TENSOR_VALUES, 0, std::string(9, 'v')));
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(GetFieldLocation(past).has_value()) << past;
  EXPECT_EQ(GetFieldLocation(past)->field, "slab.data");
  EXPECT_FALSE(assembler_.complete());
}

TEST_F(SlabAssemblerTest, AnEmptySlabFailsTheJobNamingSlabData) {
  const absl::Status empty = assembler_.Add(Slab(7, v1::TENSOR_KEYS, 0, ""));
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFieldLocation(empty)->field, "slab.data");
}

TEST_F(SlabAssemblerTest, ATensorTheJobDoesNotHaveNamesSlabTensor) {
  for (v1::Tensor tensor : {v1::TENSOR_COUNTS, v1::TENSOR_OUT_KEYS, v1::TENSOR_UNSPECIFIED}) {
    const absl::Status unknown = assembler_.Add(Slab(7, tensor, 0, "abcd"));
    EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
    EXPECT_EQ(GetFieldLocation(unknown)->field, "slab.tensor") << unknown;
  }
  const absl::Status counts = assembler_.Add(Slab(7, v1::TENSOR_COUNTS, 0, "abcd"));
  EXPECT_NE(counts.message().find("has_counts"), absl::string_view::npos) << counts;
}

TEST_F(SlabAssemblerTest, AValueThatIsNoTensorIsNamedByItsNumber) {
  const absl::Status unknown = assembler_.Add(Slab(7, static_cast<v1::Tensor>(99), 0, "abcd"));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  EXPECT_EQ(GetFieldLocation(unknown)->field, "slab.tensor") << unknown;
  EXPECT_NE(unknown.message().find("tensor 99 (no such tensor) is not a tensor of job 7"),
            absl::string_view::npos)
      << unknown;
}

TEST_F(SlabAssemblerTest, ShortTensorsAreReportedMissingInOrder) {
  EXPECT_STREQ(assembler_.FirstMissingField(), "keys");
  ASSERT_TRUE(assembler_.Add(Slab(7, v1::TENSOR_KEYS, 0, std::string(16, 'k'))).ok());
  ASSERT_TRUE(assembler_.Add(Slab(7, v1::TENSOR_VALUES, 0, std::string(3, 'v'))).ok());
  EXPECT_FALSE(assembler_.complete());
  EXPECT_STREQ(assembler_.FirstMissingField(), "values");
  EXPECT_EQ(assembler_.MissingTensors(), "TENSOR_VALUES (3 of 8 bytes)");
  ASSERT_TRUE(assembler_.Add(Slab(7, v1::TENSOR_VALUES, 3, std::string(5, 'v'))).ok());
  EXPECT_TRUE(assembler_.complete());
  EXPECT_STREQ(assembler_.FirstMissingField(), "");
  EXPECT_EQ(assembler_.MissingTensors(), "");
}

// Slabs of random sizes in a random interleaving of tensors (as a server's or a client's
// writer may produce) always assemble to the original bytes.
TEST(SlabCodecTest, InterleavedSlabsOfRandomSizesAssemble) {
  std::mt19937 rng(20261202);
  for (int round = 0; round < 50; ++round) {
    const std::vector<uint8_t> a = Bytes(1 + rng() % 5000, 9), b = Bytes(1 + rng() % 5000, 11);
    std::vector<uint8_t> got_a(a.size()), got_b(b.size());
    SlabAssembler assembler(3, {{v1::TENSOR_KEYS, got_a.data(), a.size(), "keys"},
                                {v1::TENSOR_VALUES, got_b.data(), b.size(), "values"}});
    size_t cursor_a = 0, cursor_b = 0;
    while (cursor_a < a.size() || cursor_b < b.size()) {
      const bool take_a = cursor_b == b.size() || (cursor_a < a.size() && rng() % 2 == 0);
      const std::vector<uint8_t>& source = take_a ? a : b;
      size_t& cursor = take_a ? cursor_a : cursor_b;
      const size_t length = std::min<size_t>(1 + rng() % 700, source.size() - cursor);
      ASSERT_TRUE(assembler
                      .Add(Slab(3, take_a ? v1::TENSOR_KEYS : v1::TENSOR_VALUES, cursor,
                                std::string(source.begin() + cursor,
                                            source.begin() + cursor + length)))
                      .ok());
      cursor += length;
    }
    ASSERT_TRUE(assembler.complete());
    EXPECT_EQ(got_a, a);
    EXPECT_EQ(got_b, b);
  }
}

}  // namespace
}  // namespace centroidkv
