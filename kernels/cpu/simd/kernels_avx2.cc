// The AVX2 kernel table. This translation unit alone is compiled with -mavx2 -mfma -mf16c
// (kernels/CMakeLists.txt); it runs only after simd_dispatch.cc has checked those features.
#include "kernels/cpu/simd/vec_avx2.h"
// The templates below use the traits above.
#include "kernels/cpu/simd/make_table.h"

namespace centroidkv::cpu::internal {

const KernelTable& Avx2Kernels() {
  static constexpr KernelTable kTable = MakeKernelTable<Avx2>();
  return kTable;
}

}  // namespace centroidkv::cpu::internal
