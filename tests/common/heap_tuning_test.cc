// Tests of common/heap_tuning.cc: after KeepFreedHeapMemory, a layer-sized block comes from
// the heap (no new mmap'ed region), so freeing and reallocating it does not fault it in anew.
#include "centroidkv/common/heap_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace centroidkv {
namespace {

TEST(HeapTuningTest, LayerSizedBlocksComeFromTheHeap) {
  ASSERT_TRUE(KeepFreedHeapMemory());
  const size_t before = mallinfo2().hblks;
  void* block = std::malloc(16 << 20);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 16 << 20);
  EXPECT_EQ(mallinfo2().hblks, before) << "a 16 MiB block was mmap'ed";
  std::free(block);
}

}  // namespace
}  // namespace centroidkv
