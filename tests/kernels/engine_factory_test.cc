// Tests of kernels/engine_factory.cc: which engine serves which backend kind.
#include "centroidkv/kernels/engine_factory.h"

#include <algorithm>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"

#include "gtest/gtest.h"

namespace centroidkv {
namespace {

TEST(EngineFactoryTest, ReferenceIsTheReferenceEngine) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kReference);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_NE(*engine, nullptr);
  EXPECT_EQ((*engine)->name(), "reference");
}

TEST(EngineFactoryTest, AutoAndCpuReturnEngines) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu}) {
    absl::StatusOr<const ClusterEngine*> engine = engines->Select(kind);
    ASSERT_TRUE(engine.ok()) << BackendKindName(kind) << ": " << engine.status();
    ASSERT_NE(*engine, nullptr) << BackendKindName(kind);
    EXPECT_FALSE((*engine)->name().empty());
  }
}

TEST(EngineFactoryTest, CpuIsNotAGpuEngine) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kCpu);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->name().find("cuda"), std::string_view::npos) << (*engine)->name();
}

TEST(EngineFactoryTest, GpuWithoutDeviceIsFailedPrecondition) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kGpu);
  const std::vector<std::string> names = engines->EngineNames();
  const bool has_gpu = std::any_of(names.begin(), names.end(), [](const std::string& name) {
    return name.rfind("cuda", 0) == 0;
  });
  if (has_gpu) {
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->name().rfind("cuda", 0), 0u) << (*engine)->name();
    return;
  }
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition) << engine.status();
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "gpu", std::string(engine.status().message()));
}

// GetInfo lists Devices(): one per GPU engine, named like it; auto takes the GPU when there
// is one. Here (CI, no usable CUDA device) the list is empty.
TEST(EngineFactoryTest, DevicesMatchTheGpuEngines) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  const std::vector<std::string> names = engines->EngineNames();
  const auto gpu_engines = std::count_if(names.begin(), names.end(), [](const std::string& name) {
    return name.rfind("cuda:", 0) == 0;
  });
  ASSERT_EQ(static_cast<int64_t>(engines->Devices().size()), gpu_engines);
  for (const DeviceInfo& device : engines->Devices()) {
    EXPECT_NE(std::find(names.begin(), names.end(), device.backend), names.end()) << device.backend;
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.memory_bytes, 0);
  }
  absl::StatusOr<const ClusterEngine*> automatic = engines->Select(BackendKind::kAuto);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  if (engines->Devices().empty()) {
    EXPECT_EQ((*automatic)->name(), "cpu");
  } else {
    EXPECT_EQ((*automatic)->name(), engines->Devices()[0].backend);
  }
}

TEST(EngineFactoryTest, EngineNamesIncludeReferenceOnce) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  const std::vector<std::string> names = engines->EngineNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "reference"), 1);
  for (const std::string& name : names) {
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name << " listed twice";
  }
}

TEST(EngineFactoryTest, SelectedEnginesAreListed) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  const std::vector<std::string> names = engines->EngineNames();
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu, BackendKind::kReference}) {
    absl::StatusOr<const ClusterEngine*> engine = engines->Select(kind);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_NE(std::find(names.begin(), names.end(), std::string((*engine)->name())), names.end())
        << BackendKindName(kind) << " selects " << (*engine)->name() << ", not listed";
  }
}

TEST(EngineFactoryTest, EnginesCarryTheLimits) {
  EngineLimits limits;
  limits.max_heads = 3;
  limits.max_tokens = 77;
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable(limits);
  EXPECT_EQ(engines->limits().max_heads, 3);
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu, BackendKind::kReference}) {
    absl::StatusOr<const ClusterEngine*> engine = engines->Select(kind);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->limits().max_heads, 3) << BackendKindName(kind);
    EXPECT_EQ((*engine)->limits().max_tokens, 77) << BackendKindName(kind);
  }
}

TEST(EngineFactoryTest, BackendKindNames) {
  EXPECT_EQ(BackendKindName(BackendKind::kAuto), "auto");
  EXPECT_EQ(BackendKindName(BackendKind::kCpu), "cpu");
  EXPECT_EQ(BackendKindName(BackendKind::kGpu), "gpu");
  EXPECT_EQ(BackendKindName(BackendKind::kReference), "reference");
  EXPECT_EQ(BackendKindName(BackendKind::kIdentity), "identity");
}

TEST(EngineFactoryTest, IdentityReturnsItsInputUnchanged) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kIdentity);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->name(), "identity");
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu}) {
    absl::StatusOr<const ClusterEngine*> other = engines->Select(kind);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(*other, *engine) << BackendKindName(kind) << " must never select identity";
  }
  constexpr int32_t kHeads = 2, kTokens = 100, kDk = 4, kDv = 3;
  std::vector<uint16_t> keys(kHeads * kTokens * kDk), values(kHeads * kTokens * kDv);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = FloatToHalf(0.25f * static_cast<float>(i % 37) - 3.0f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = FloatToHalf(0.5f * static_cast<float>(i % 11));
  std::vector<uint32_t> counts(kHeads * kTokens);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = 1 + static_cast<uint32_t>(i % 5);
  LayerView layer;
  layer.dtype = DType::kFloat16;
  layer.num_heads = kHeads;
  layer.num_tokens = kTokens;
  layer.key_dim = kDk;
  layer.value_dim = kDv;
  layer.keys = keys.data();
  layer.values = values.data();
  layer.counts = counts.data();
  absl::StatusOr<CompressResult> result = (*engine)->Compress(layer, CompressOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->total_entries(), kHeads * kTokens);
  ASSERT_EQ(result->offsets.size(), static_cast<size_t>(kHeads + 1));
  for (int32_t h = 0; h <= kHeads; ++h) EXPECT_EQ(result->offsets[h], int64_t{h} * kTokens);
  ASSERT_EQ(result->keys.size(), keys.size());
  ASSERT_EQ(result->values.size(), values.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(result->keys[i], HalfToFloat(keys[i])) << i;
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(result->values[i], HalfToFloat(values[i])) << i;
  }
  EXPECT_EQ(result->counts, counts);
  ASSERT_EQ(result->assignment.size(), static_cast<size_t>(kHeads * kTokens));
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t t = 0; t < kTokens; ++t) EXPECT_EQ(result->assignment[h * kTokens + t], t);
  }
  // Without counts every count is 1.
  layer.counts = nullptr;
  result = (*engine)->Compress(layer, CompressOptions{});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->counts, std::vector<uint32_t>(kHeads * kTokens, 1u));
}

}  // namespace
}  // namespace centroidkv
