// HostPipelineEngine: one job as a batch of one, every stage a plain loop.
#include "kernels/cuda/host_pipeline.h"

#include <algorithm>
#include <array>
#include <barrier>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "kernels/cuda/layer_batch.h"
#include "kernels/cuda/tile_match.h"

namespace centroidkv::cuda {
namespace {

// A 256-byte aligned block (the device workspace's stand-in).
class HostBlock {
 public:
  // Filled with a pattern, not zeros, so that a stage reading what no stage wrote shows up
  // as a wrong result (device memory is not zeroed either).
  explicit HostBlock(size_t bytes) : storage_((bytes + 255) / 8 + 32, 0xa5a5a5a5a5a5a5a5ULL) {}
  void* data() {
    auto at = reinterpret_cast<uintptr_t>(storage_.data());
    return reinterpret_cast<void*>((at + 255) / 256 * 256);
  }

 private:
  std::vector<uint64_t> storage_;
};

// 32 threads as the lanes of one warp: Sum() meets every lane at a barrier and gives each
// the butterfly sum the device computes (lane 0's value after xor shuffles 16, 8, 4, 2, 1).
class BarrierWarp final : public HostWarp {
 public:
  static constexpr int32_t kLanes = 32;

  float Sum(int32_t lane, float v) override { return Reduce(floats_, lane, v); }
  double Sum(int32_t lane, double v) override { return Reduce(doubles_, lane, v); }
  void Sync() override { barrier_.arrive_and_wait(); }

 private:
  template <typename T>
  T Reduce(std::array<T, kLanes>& slots, int32_t lane, T v) {
    slots[lane] = v;
    barrier_.arrive_and_wait();
    std::array<T, kLanes> values = slots;
    for (int32_t offset = 16; offset > 0; offset /= 2) {
      std::array<T, kLanes> next;
      for (int32_t i = 0; i < kLanes; ++i) next[i] = values[i] + values[i ^ offset];
      values = next;
    }
    barrier_.arrive_and_wait();  // nobody writes the slots again before all have read them
    return values[0];
  }

  std::barrier<> barrier_{kLanes};
  std::array<float, kLanes> floats_{};
  std::array<double, kLanes> doubles_{};
};

// The threads of one emulated block (BlockSync).
class BarrierBlock final : public HostBlockBarrier {
 public:
  explicit BarrierBlock(int32_t threads) : barrier_(threads) {}
  void Sync() override { barrier_.arrive_and_wait(); }

 private:
  std::barrier<> barrier_;
};

class HostExecutor {
 public:
  HostExecutor(const LayerBatch& batch, const BatchArrays& arrays, int32_t warp_lanes)
      : batch_(batch), arrays_(arrays), warp_lanes_(warp_lanes) {}

  absl::Status Stage(StageId id, int64_t items, const PassArgs& pass) {
    if (id == StageId::kMatchTiles) {
      // The block's shared memory (128-byte aligned, like the device's), then each block
      // as one warp of one lane, or with 32-lane warps as kTileWarps x 32 threads.
      std::vector<uint64_t> smem(MakeTileLayout(batch_.params().key_dim).bytes / 8 + 16,
                                 0xa5a5a5a5a5a5a5a5ULL);  // garbage, as on the device
      char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem.data()) + 127) /
                                           128 * 128);
      if (warp_lanes_ != BarrierWarp::kLanes) {
        for (int64_t item = 0; item < items; ++item) {
          TileMatchBlock(batch_.params(), arrays_, pass, item, base, 0, 1);
        }
        return absl::OkStatus();
      }
      BarrierBlock block(kTileWarps * BarrierWarp::kLanes);
      std::array<BarrierWarp, kTileWarps> warps;
      std::vector<std::thread> threads;
      for (int32_t w = 0; w < kTileWarps; ++w) {
        for (int32_t lane = 0; lane < BarrierWarp::kLanes; ++lane) {
          threads.emplace_back([&, w, lane] {
            CurrentHostLane() = HostLane{lane, BarrierWarp::kLanes, &warps[w], &block};
            for (int64_t item = 0; item < items; ++item) {
              TileMatchBlock(batch_.params(), arrays_, pass, item, base, w, kTileWarps);
              BlockSync();  // as the kernel does before the next item reuses shared memory
            }
            CurrentHostLane() = HostLane{};
          });
        }
      }
      for (std::thread& thread : threads) thread.join();
      return absl::OkStatus();
    }
    if (warp_lanes_ == BarrierWarp::kLanes && IsWarpStage(id)) {
      BarrierWarp warp;
      std::vector<std::thread> lanes;
      for (int32_t lane = 0; lane < BarrierWarp::kLanes; ++lane) {
        lanes.emplace_back([&, lane] {
          CurrentHostLane() = HostLane{lane, BarrierWarp::kLanes, &warp};
          for (int64_t item = 0; item < items; ++item) {
            RunStageItem(id, batch_.params(), arrays_, pass, item);
          }
          CurrentHostLane() = HostLane{};
        });
      }
      for (std::thread& lane : lanes) lane.join();
      return absl::OkStatus();
    }
    for (int64_t item = 0; item < items; ++item) {
      RunStageItem(id, batch_.params(), arrays_, pass, item);
    }
    return absl::OkStatus();
  }

  absl::Status Sort() {
    const BatchParams& p = batch_.params();
    std::vector<int32_t> order;
    for (int64_t g = 0; g < p.global_heads(); ++g) {
      const int32_t begin = arrays_.seg_begin[g], end = arrays_.seg_end[g];
      order.resize(static_cast<size_t>(end - begin));
      std::iota(order.begin(), order.end(), begin);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
        return arrays_.sort_keys_in[x] > arrays_.sort_keys_in[y];
      });
      for (int32_t k = 0; k < end - begin; ++k) {
        arrays_.sort_keys_out[begin + k] = arrays_.sort_keys_in[order[k]];
        arrays_.sort_values_out[begin + k] = arrays_.sort_values_in[order[k]];
      }
    }
    return absl::OkStatus();
  }

 private:
  const LayerBatch& batch_;
  BatchArrays arrays_;
  int32_t warp_lanes_;
};

}  // namespace

absl::Status HostPipelineEngine::CompressImpl(const LayerPlan& plan, const LayerView& layer,
                                              const CompressControl& control,
                                              CompressResult* out) const {
  if (control.IsCancelled()) return absl::CancelledError("job cancelled");
  const BatchJob job{&plan, &layer, out};
  return RunBatchOnHost({&job, 1}, warp_lanes_, match_);
}

absl::Status RunBatchOnHost(std::span<const BatchJob> jobs, int32_t warp_lanes,
                            MatchKernel match) {
  absl::StatusOr<LayerBatch> batch = LayerBatch::Create(jobs, match);
  if (!batch.ok()) return batch.status();
  const WorkspaceSizes& sizes = batch->sizes();
  HostBlock input(sizes.input), work(sizes.work), small_out(sizes.small_out), owner(sizes.owner),
      packed(sizes.packed);
  const BatchArrays arrays =
      batch->Carve(input.data(), work.data(), small_out.data(), owner.data(), packed.data());
  batch->StageInputs(input.data());
  HostExecutor exec(*batch, arrays, warp_lanes);
  if (absl::Status status = RunBatchStages(*batch, exec); !status.ok()) return status;
  batch->ExtractResults(small_out.data(), arrays.owner, packed.data());
  return absl::OkStatus();
}

}  // namespace centroidkv::cuda
