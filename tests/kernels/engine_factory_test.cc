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
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kCuda);
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
  EXPECT_EQ(BackendKindName(BackendKind::kCuda), "cuda");
  EXPECT_EQ(BackendKindName(BackendKind::kReference), "reference");
  EXPECT_EQ(BackendKindName(BackendKind::kIdentity), "identity");
  // Every name parses back to its kind; "gpu" (the wire's and the CLI's older spelling) is
  // an alias of cuda; anything else is refused.
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu, BackendKind::kCuda,
                           BackendKind::kReference, BackendKind::kIdentity}) {
    EXPECT_EQ(ParseBackendKind(BackendKindName(kind)), kind);
  }
  EXPECT_EQ(ParseBackendKind("gpu"), BackendKind::kCuda);
  EXPECT_EQ(ParseBackendKind("GPU"), std::nullopt);
  EXPECT_EQ(ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(ParseTensorLayout("token_major"), TensorLayout::kTokenMajor);
  EXPECT_EQ(KindNameList<BackendKind>(kBackendKindNames), "auto|cpu|cuda|reference|identity|gpu");
}

TEST(EngineFactoryTest, IdentityIsMeasurementOnly) {
  const std::unique_ptr<EngineSet> engines = EngineSet::CreateAvailable();
  absl::StatusOr<const ClusterEngine*> engine = engines->Select(BackendKind::kIdentity);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->name(), "identity");
  for (BackendKind kind : {BackendKind::kAuto, BackendKind::kCpu}) {
    absl::StatusOr<const ClusterEngine*> other = engines->Select(kind);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(*other, *engine) << BackendKindName(kind) << " must never select identity";
  }
}

}  // namespace
}  // namespace centroidkv
