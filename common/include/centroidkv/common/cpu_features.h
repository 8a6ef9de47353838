// x86-64 feature bits read straight from CPUID, for the features that
// __builtin_cpu_supports does not know in every compiler we build with (clang 14 has no
// "f16c", "amx-tile" or "amx-bf16"; GCC 12 has them). Callers still ask
// __builtin_cpu_supports("avx") / ("avx512f") first: that is what checks that the OS saves
// the wider registers. Thread-safe: no state.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>

namespace centroidkv {

// Bit `bit` of register ecx (leaf 1) or edx (leaf 7, subleaf 0).
inline bool CpuidLeaf1Ecx(int bit) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && ((ecx >> bit) & 1u) != 0;
}
inline bool CpuidLeaf7Edx(int bit) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && ((edx >> bit) & 1u) != 0;
}

inline bool CpuHasF16c() { return CpuidLeaf1Ecx(29); }
inline bool CpuHasAmxBf16() { return CpuidLeaf7Edx(22); }
inline bool CpuHasAmxTile() { return CpuidLeaf7Edx(24); }

}  // namespace centroidkv
#endif
