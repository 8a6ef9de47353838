// Helpers shared by the cpu engine's tests (cpu_engine_test.cc, cpu_engine_fp8_test.cc):
// options of a job in one line, and a compression that fails the test on an error.
#pragma once

#include <cstdint>
#include <utility>

#include "centroidkv/kernels/engine.h"
#include "gtest/gtest.h"

namespace centroidkv::test {

inline CompressOptions Options(int32_t chunk, int32_t sink, int32_t recent, double ratio,
                               int32_t passes = CompressOptions::kDefaultMaxPasses) {
  return CompressOptions{.target_ratio = ratio, .chunk_size = chunk, .sink_tokens = sink,
                         .recent_tokens = recent, .max_passes = passes};
}

inline CompressResult CompressOrFail(const ClusterEngine& engine, const LayerView& layer,
                                     const CompressOptions& options) {
  absl::StatusOr<CompressResult> result = engine.Compress(layer, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : CompressResult{};
}

}  // namespace centroidkv::test
