// Tests of the BlockWriter of kernels/cpu/layer_job.h (the engine's path from merged rows to
// the CompressResult), at every SIMD level this CPU supports: rows of many lengths written to
// blocks at every float offset within a 64-byte line arrive exactly, and nothing outside the
// block is touched (a neighbouring block may belong to another thread). The engine itself,
// layer_job.cc included, is tested against the reference in cpu_engine_test.cc.
#include "kernels/cpu/layer_job.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/simd_dispatch.h"

namespace centroidkv::cpu {
namespace {

class BlockWriterTest : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(BlockWriterTest, WritesEveryRowExactlyAndNothingElse) {
  const KernelTable& kernels = KernelsFor(GetParam());
  constexpr float kUntouched = -7.0f;
  for (int32_t dim : {1, 3, 15, 16, 17, 64, 100, 128, 1030, 2100}) {
    for (int32_t rows : {0, 1, 2, 7, 40}) {
      for (int32_t shift = 0; shift < 17; ++shift) {
        SCOPED_TRACE("dim " + std::to_string(dim) + ", rows " + std::to_string(rows) +
                     ", shift " + std::to_string(shift));
        const int64_t floats = int64_t{rows} * dim;
        // 64-byte aligned storage; the block starts `shift` floats past a line boundary.
        std::vector<float> storage(static_cast<size_t>(floats + 64), kUntouched);
        float* line = storage.data();
        while (reinterpret_cast<uintptr_t>(line) % 64 != 0) ++line;
        float* block = line + shift;
        std::vector<float> buffer_storage(static_cast<size_t>(BlockWriter::Capacity(dim) + 16));
        float* buffer = buffer_storage.data();
        while (reinterpret_cast<uintptr_t>(buffer) % 64 != 0) ++buffer;
        BlockWriter writer;
        writer.Start(kernels, buffer, dim, block);
        for (int32_t r = 0; r < rows; ++r) {
          float* row = writer.Next();
          for (int32_t j = 0; j < dim; ++j) row[j] = static_cast<float>(r * 10000 + j);
        }
        writer.Finish();
        for (float* p = storage.data(); p < block; ++p) ASSERT_EQ(*p, kUntouched) << "before";
        for (int32_t r = 0; r < rows; ++r) {
          for (int32_t j = 0; j < dim; ++j) {
            ASSERT_EQ(block[int64_t{r} * dim + j], static_cast<float>(r * 10000 + j))
                << "row " << r << ", element " << j;
          }
        }
        for (float* p = block + floats; p < storage.data() + storage.size(); ++p) {
          ASSERT_EQ(*p, kUntouched) << "after";
        }
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
