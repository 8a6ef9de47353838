#include "kernels/cpu/simd_dispatch.h"

#include <cassert>

namespace centroidkv::cpu {

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool SimdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case SimdLevel::kAvx512:
      return SimdLevelSupported(SimdLevel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}

SimdLevel DetectSimdLevel() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (SimdLevelSupported(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
    if (SimdLevelSupported(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (SimdLevelSupported(level)) levels.push_back(level);
  }
  return levels;
}

const KernelTable& KernelsFor(SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
    case SimdLevel::kAvx512:
      return internal::Avx512Kernels();
    case SimdLevel::kAvx2:
      return internal::Avx2Kernels();
    case SimdLevel::kScalar:
      break;
  }
  return internal::ScalarKernels();
}

}  // namespace centroidkv::cpu
