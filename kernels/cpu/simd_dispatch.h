// Run-time choice of the CPU backend's kernels (kernel_table.h) from the features of the CPU
// the process runs on (__builtin_cpu_supports, which also checks that the OS saves the
// vector registers; for AMX, the process asks the kernel for the tile state once,
// arch_prctl ARCH_REQ_XCOMP_PERM). The AVX2 and AVX-512 kernels live in translation units compiled with
// their own -m flags; nothing else in the build assumes more than baseline x86-64.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/cpu/kernel_table.h"

namespace centroidkv::cpu {

enum class SimdLevel : uint8_t {
  kScalar,  // portable C++, any CPU
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F/BW/DQ/VL + FMA + F16C
  kAmx,     // kAvx512 + AVX512-BF16 + AMX-TILE/BF16, with the OS's permission for the tiles
};

std::string_view SimdLevelName(SimdLevel level);

// The best level this CPU supports.
SimdLevel DetectSimdLevel();

// Whether the kernels of `level` can run here.
bool SimdLevelSupported(SimdLevel level);

// Every level that can run here, scalar first.
std::vector<SimdLevel> SupportedSimdLevels();

// The kernels of `level`; `level` must be supported (checked with assert).
const KernelTable& KernelsFor(SimdLevel level);

}  // namespace centroidkv::cpu
