// Tests of the BlockWriter of kernels/cpu/block_writer.h (the engine's path from merged rows to
// the CompressResult), at every SIMD level this CPU supports: rows of many lengths written to
// float32, fp16, bf16 and fp8 blocks at every element offset within a 64-byte line arrive
// exactly (rounded once, as common/dtype.h rounds them), and nothing outside the block is
// touched (a neighbouring block may belong to another thread). The engine itself,
// layer_job*.cc included, is tested against the reference in cpu_engine_test.cc.
#include "kernels/cpu/block_writer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"

#include "gtest/gtest.h"
#include "kernels/cpu/simd_dispatch.h"

namespace centroidkv::cpu {
namespace {

class BlockWriterTest : public ::testing::TestWithParam<SimdLevel> {};

// A finite float of every magnitude (normals, subnormals, values past the fp16 range, ties
// of fp16 and bf16 rounding) for element j of row r.
float TestValue(int32_t r, int32_t j) {
  uint32_t bits = (static_cast<uint32_t>(r) * 2654435761u) ^ (static_cast<uint32_t>(j) * 40503u);
  bits ^= bits >> 13;
  bits *= 0x5bd1e995u;
  bits ^= bits >> 15;
  if (j % 5 == 0) bits = (bits & 0xffff0000u) | 0x8000u;      // a bf16 tie
  if (j % 7 == 0) bits = (bits & 0x87ffe000u) | 0x38001000u;  // an fp16 tie near 1
  if (((bits >> 23) & 0xffu) == 0xffu) bits &= ~(1u << 30);  // no Inf / NaN
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// The scale of the fp8 blocks (not a power of two: the division rounds).
constexpr float kFp8Scale = 0.37f;

// The bits of `value` as a result row of `type` holds it (fp8: divided by kFp8Scale, rounded
// once, saturating).
uint32_t Expected(ElemType type, float value) {
  switch (type) {
    case ElemType::kF16:
      return FloatToHalf(value);
    case ElemType::kBF16:
      return FloatToBFloat16(value);
    case ElemType::kE4M3:
      return FloatToFp8(value / kFp8Scale, DType::kFp8E4M3);
    case ElemType::kE5M2:
      return FloatToFp8(value / kFp8Scale, DType::kFp8E5M2);
    default:
      break;
  }
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Element i of a block of `type`, as bits.
uint32_t Element(ElemType type, const unsigned char* block, int64_t i) {
  if (type == ElemType::kF32) {
    uint32_t bits;
    std::memcpy(&bits, block + 4 * i, sizeof(bits));
    return bits;
  }
  if (IsFp8Elem(type)) return block[i];
  uint16_t bits;
  std::memcpy(&bits, block + 2 * i, sizeof(bits));
  return bits;
}

TEST_P(BlockWriterTest, WritesEveryRowExactlyAndNothingElse) {
  const KernelTable& kernels = KernelsFor(GetParam());
  constexpr unsigned char kUntouched = 0xa5;
  for (ElemType type :
       {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kE4M3, ElemType::kE5M2}) {
    const int64_t element_bytes = ElemTypeBytes(type);
    for (int32_t dim : {1, 3, 15, 16, 17, 33, 64, 100, 128, 1030, 2100}) {
      for (int32_t rows : {0, 1, 2, 7, 40}) {
        for (int32_t shift = 0; shift < 64 / element_bytes + 1; ++shift) {
          SCOPED_TRACE("type " + std::to_string(static_cast<int>(type)) + ", dim " +
                       std::to_string(dim) + ", rows " + std::to_string(rows) + ", shift " +
                       std::to_string(shift));
          const int64_t elements = int64_t{rows} * dim;
          // 64-byte aligned storage; the block starts `shift` elements past a line boundary.
          std::vector<unsigned char> storage(
              static_cast<size_t>((elements + 64) * element_bytes + 64), kUntouched);
          unsigned char* line = storage.data();
          while (reinterpret_cast<uintptr_t>(line) % 64 != 0) ++line;
          unsigned char* block = line + shift * element_bytes;
          std::vector<float> buffer_storage(static_cast<size_t>(BlockWriter::Capacity(dim) + 16));
          float* buffer = buffer_storage.data();
          while (reinterpret_cast<uintptr_t>(buffer) % 64 != 0) ++buffer;
          BlockWriter writer;
          writer.Start(kernels, buffer, dim, type, block, kFp8Scale);
          for (int32_t r = 0; r < rows; ++r) {
            float* row = writer.Next();
            for (int32_t j = 0; j < dim; ++j) row[j] = TestValue(r, j);
          }
          writer.Finish();
          EXPECT_TRUE(writer.finite());
          for (unsigned char* p = storage.data(); p < block; ++p) {
            ASSERT_EQ(*p, kUntouched) << "before";
          }
          for (int32_t r = 0; r < rows; ++r) {
            for (int32_t j = 0; j < dim; ++j) {
              ASSERT_EQ(Element(type, block, int64_t{r} * dim + j), Expected(type, TestValue(r, j)))
                  << "row " << r << ", element " << j << " = " << TestValue(r, j);
            }
          }
          for (unsigned char* p = block + elements * element_bytes;
               p < storage.data() + storage.size(); ++p) {
            ASSERT_EQ(*p, kUntouched) << "after";
          }
        }
      }
    }
  }
}

// finite() is false once any float written is Inf or NaN, wherever it lands in the block
// (the unaligned ends or the streamed middle), whatever the result type.
TEST_P(BlockWriterTest, NotesANonFiniteFloat) {
  const KernelTable& kernels = KernelsFor(GetParam());
  constexpr int32_t kDim = 100;
  for (ElemType type :
       {ElemType::kF32, ElemType::kF16, ElemType::kBF16, ElemType::kE4M3, ElemType::kE5M2}) {
    for (float bad : {std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      for (int32_t at : {0, 3, 40, 99, 150, 299}) {
        SCOPED_TRACE("type " + std::to_string(static_cast<int>(type)) + ", at " +
                     std::to_string(at));
        std::vector<unsigned char> storage(static_cast<size_t>(3 * kDim * 4 + 128));
        std::vector<float> buffer_storage(static_cast<size_t>(BlockWriter::Capacity(kDim) + 16));
        float* buffer = buffer_storage.data();
        while (reinterpret_cast<uintptr_t>(buffer) % 64 != 0) ++buffer;
        BlockWriter writer;
        // Off the vector alignment, but aligned for the element type (a float at an odd
        // 2-byte offset would itself be undefined behaviour).
        const size_t offset = type == ElemType::kF32 ? 4 : IsFp8Elem(type) ? 5 : 6;
        writer.Start(kernels, buffer, kDim, type, storage.data() + offset, kFp8Scale);
        for (int32_t r = 0; r < 3; ++r) {
          float* row = writer.Next();
          for (int32_t j = 0; j < kDim; ++j) row[j] = r * kDim + j == at ? bad : 1.0f;
        }
        writer.Finish();
        EXPECT_FALSE(writer.finite());
      }
    }
  }
}

// fits() is false exactly when a finite float rounds to Inf in the block's type (fp16 from
// 65520 up, bf16 from 0x7f7f8000 up: HalfOverflowBits), wherever it lands in the block; the
// largest magnitudes below those fit. finite() stays true: the floats themselves are finite.
TEST_P(BlockWriterTest, NotesAFloatThatRoundsToInf) {
  const KernelTable& kernels = KernelsFor(GetParam());
  constexpr int32_t kDim = 100;
  for (ElemType type : {ElemType::kF16, ElemType::kBF16}) {
    const uint32_t overflow = HalfOverflowBits(type);
    float first_inf, last_finite;
    const uint32_t below = overflow - 1;
    std::memcpy(&first_inf, &overflow, sizeof(float));
    std::memcpy(&last_finite, &below, sizeof(float));
    ASSERT_EQ(Expected(type, first_inf) & 0x7fffu, type == ElemType::kF16 ? 0x7c00u : 0x7f80u);
    ASSERT_NE(Expected(type, last_finite) & 0x7fffu, type == ElemType::kF16 ? 0x7c00u : 0x7f80u);
    for (float edge : {first_inf, -first_inf, last_finite, -last_finite}) {
      for (int32_t at : {0, 3, 40, 99, 150, 299}) {
        SCOPED_TRACE("type " + std::to_string(static_cast<int>(type)) + ", value " +
                     std::to_string(edge) + ", at " + std::to_string(at));
        std::vector<unsigned char> storage(static_cast<size_t>(3 * kDim * 2 + 128));
        std::vector<float> buffer_storage(static_cast<size_t>(BlockWriter::Capacity(kDim) + 16));
        float* buffer = buffer_storage.data();
        while (reinterpret_cast<uintptr_t>(buffer) % 64 != 0) ++buffer;
        BlockWriter writer;
        writer.Start(kernels, buffer, kDim, type, storage.data() + 6);
        for (int32_t r = 0; r < 3; ++r) {
          float* row = writer.Next();
          for (int32_t j = 0; j < kDim; ++j) row[j] = r * kDim + j == at ? edge : 1.0f;
        }
        writer.Finish();
        EXPECT_TRUE(writer.finite());
        EXPECT_EQ(writer.fits(), std::abs(edge) < first_inf);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, BlockWriterTest, ::testing::ValuesIn(SupportedSimdLevels()),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(SimdLevelName(info.param));
                         });

}  // namespace
}  // namespace centroidkv::cpu
