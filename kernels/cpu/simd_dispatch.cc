#include "kernels/cpu/simd_dispatch.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cassert>

#include "centroidkv/common/cpu_features.h"

namespace centroidkv::cpu {
namespace {

// Linux (5.16+) hands the AMX tile data state to a process only on request; without it the
// first tile instruction faults. Asked once; any failure (an older kernel, a hypervisor that
// hides the state, a signal stack too small for it) means no AMX.
bool AmxTilesPermitted() {
  static const bool permitted = [] {
    constexpr long kArchGetXcompPerm = 0x1022;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureTileData = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
    unsigned long features = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &features) != 0) return false;
    return (features & (1ul << kXfeatureTileData)) != 0;
  }();
  return permitted;
}

}  // namespace

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAmx:
      return "amx";
  }
  return "unknown";
}

bool SimdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             CpuHasF16c();
    case SimdLevel::kAvx512:
      return SimdLevelSupported(SimdLevel::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    case SimdLevel::kAmx:
      return SimdLevelSupported(SimdLevel::kAvx512) && __builtin_cpu_supports("avx512bf16") &&
             CpuHasAmxTile() && CpuHasAmxBf16() &&
             AmxTilesPermitted();
  }
  return false;
}

SimdLevel DetectSimdLevel() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (SimdLevelSupported(SimdLevel::kAmx)) return SimdLevel::kAmx;
    if (SimdLevelSupported(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
    if (SimdLevelSupported(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (SimdLevelSupported(level)) levels.push_back(level);
  }
  return levels;
}

const KernelTable& KernelsFor(SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
    case SimdLevel::kAmx:
      return internal::AmxKernels();
    case SimdLevel::kAvx512:
      // Matching in 16-bit integers where the CPU has VNNI's vpdpwssd (the same level:
      // only match_int16 differs, and its results are the same).
      return __builtin_cpu_supports("avx512vnni") ? internal::Avx512VnniKernels()
                                                  : internal::Avx512Kernels();
    case SimdLevel::kAvx2:
      return internal::Avx2Kernels();
    case SimdLevel::kScalar:
      break;
  }
  return internal::ScalarKernels();
}

}  // namespace centroidkv::cpu
