// The warp lanes of the CUDA backend's warp stages (IsWarpStage): lane index and count, the
// warp-wide sum and the atomic counter on the device, and their host twins (HostWarp,
// HostBlockBarrier, HostLane) through which host threads emulate a warp or a block.
#pragma once

#include <cstdint>

#include "kernels/cuda/stage_types.h"

namespace centroidkv::cuda {

// Warp stages (IsWarpStage): on the device the 32 lanes of a warp run one item together,
// splitting the loops over a row's elements (coalesced loads) and combining float sums with
// shuffles; everything else they compute redundantly (identical values), and only the lead
// lane writes. On the host one "lane" runs the item, or (tests) 32 threads emulate a warp:
// each thread's HostLane says which lane it is and where the warp sums.
#if !defined(__CUDA_ARCH__)
class HostWarp {
 public:
  virtual ~HostWarp() = default;
  // The warp-wide sum as the device's butterfly computes it (lane 0's value), for every lane.
  virtual float Sum(int32_t lane, float v) = 0;
  virtual double Sum(int32_t lane, double v) = 0;
  // Waits for every lane of the warp (__syncwarp).
  virtual void Sync() = 0;
};
// The barrier of a block's threads (__syncthreads), for block stages run on host threads.
class HostBlockBarrier {
 public:
  virtual ~HostBlockBarrier() = default;
  virtual void Sync() = 0;
};
struct HostLane {
  int32_t index = 0;
  int32_t count = 1;
  HostWarp* warp = nullptr;
  HostBlockBarrier* block = nullptr;
};
inline HostLane& CurrentHostLane() {
  static thread_local HostLane lane;
  return lane;
}
#endif
CKV_HD constexpr bool IsWarpStage(StageId id) {
  return id == StageId::kNormalize || id == StageId::kMatch || id == StageId::kMerge ||
         id == StageId::kEmit;
}
CKV_HD int32_t LaneIndex() {
#if defined(__CUDA_ARCH__)
  return static_cast<int32_t>(threadIdx.x & 31u);
#else
  return CurrentHostLane().index;
#endif
}
CKV_HD int32_t LaneCount() {
#if defined(__CUDA_ARCH__)
  return 32;
#else
  return CurrentHostLane().count;
#endif
}
CKV_HD bool LeadLane() { return LaneIndex() == 0; }

// The sum of `v` over the warp's lanes, the same value in every lane (lane 0's broadcast).
template <typename T>
CKV_HD T LaneSum(T v) {
#if defined(__CUDA_ARCH__)
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return __shfl_sync(0xffffffffu, v, 0);
#else
  const HostLane& lane = CurrentHostLane();
  return lane.warp == nullptr ? v : lane.warp->Sum(lane.index, v);
#endif
}

// Atomic on the device and on the host (where a block stage may run on many threads).
CKV_HD void AtomicIncrement(int32_t* counter) {
#if defined(__CUDA_ARCH__)
  atomicAdd(counter, 1);
#else
  __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);  // GCC's builtin: C++17 for nvcc too
#endif
}

}  // namespace centroidkv::cuda
