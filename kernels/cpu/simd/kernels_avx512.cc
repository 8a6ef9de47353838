// The AVX-512 kernel table. This translation unit alone is compiled with -mavx512f
// -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c (kernels/CMakeLists.txt); it runs only
// after simd_dispatch.cc has checked those features.
#include "kernels/cpu/simd/vec_avx512.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"

namespace centroidkv::cpu::internal {

const KernelTable& Avx512Kernels() {
  static constexpr KernelTable kTable = MakeKernelTable<Avx512>();
  return kTable;
}

}  // namespace centroidkv::cpu::internal
