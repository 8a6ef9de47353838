#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/common/synthetic_kv.h"

namespace centroidkv::bench {
namespace {

// One head of one tensor, widened from the shared generator and rounded to fp16.
void FillHead(const WorkloadSpec& spec, uint64_t stream, uint16_t* out) {
  SyntheticKvSpec synthetic;
  synthetic.tokens = spec.tokens;
  synthetic.seed = spec.seed;
  synthetic.topics = spec.topics;
  synthetic.noise = spec.noise;
  synthetic.stay = spec.stay;
  std::vector<float> rows(static_cast<size_t>(spec.tokens) * spec.dim);
  SynthesizeHead(synthetic, spec.dim, stream, rows.data());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = FloatToHalf(rows[i]);
}

}  // namespace

LayerView Workload::View() const {
  LayerView view{.dtype = DType::kFloat16, .layout = TensorLayout::kHeadMajor,
      .num_heads = spec.heads, .num_tokens = spec.tokens, .key_dim = spec.dim,
      .value_dim = spec.dim, .keys = keys.data(), .values = values.data()};
  view.counts = nullptr;  // fresh tokens: every count is 1
  if (IsFp8(fp8)) {
    view.dtype = fp8;
    view.keys = fp8_keys.data();
    view.values = fp8_values.data();
    view.key_scales = key_scales;
    view.value_scales = value_scales;
  }
  return view;
}

void AddFp8Rows(DType dtype, Workload* workload) {
  const size_t per_head = static_cast<size_t>(workload->spec.tokens) * workload->spec.dim;
  auto quantise = [&](const std::vector<uint16_t>& rows, std::vector<uint8_t>* codes,
                      std::vector<float>* scales) {
    codes->resize(rows.size());
    scales->assign(static_cast<size_t>(workload->spec.heads), 0.0f);
    for (int32_t h = 0; h < workload->spec.heads; ++h) {
      float amax = 0.0f;
      for (size_t i = per_head * h; i < per_head * (h + 1); ++i) {
        amax = std::max(amax, std::fabs(HalfToFloat(rows[i])));
      }
      const float scale = amax > 0.0f ? amax / Fp8MaxFinite(dtype) : 1.0f;
      (*scales)[h] = scale;
      for (size_t i = per_head * h; i < per_head * (h + 1); ++i) {
        (*codes)[i] = FloatToFp8(HalfToFloat(rows[i]) / scale, dtype);
      }
    }
  };
  quantise(workload->keys, &workload->fp8_keys, &workload->key_scales);
  quantise(workload->values, &workload->fp8_values, &workload->value_scales);
  workload->fp8 = dtype;
}

Workload MakeWorkload(const WorkloadSpec& spec) {
  Workload workload;
  workload.spec = spec;
  const size_t per_head = static_cast<size_t>(spec.tokens) * spec.dim;
  workload.keys.resize(per_head * spec.heads);
  workload.values.resize(per_head * spec.heads);
  for (int32_t h = 0; h < spec.heads; ++h) {
    FillHead(spec, 2 * static_cast<uint64_t>(h), &workload.keys[per_head * h]);
    FillHead(spec, 2 * static_cast<uint64_t>(h) + 1, &workload.values[per_head * h]);
  }
  return workload;
}

std::vector<ChunkSpan> FirstPassChunks(int32_t tokens, int32_t chunk_size, int32_t sink,
                                       int32_t recent) {
  std::vector<ChunkSpan> chunks;
  const int64_t begin = sink;
  const int64_t end = int64_t{tokens} - recent;
  if (end - begin < 2) return chunks;
  for (int64_t start = begin; start < end; start += chunk_size) {
    const int64_t stop = std::min<int64_t>(start + chunk_size, end);
    chunks.push_back({static_cast<int32_t>(start), static_cast<int32_t>(stop - start)});
  }
  return chunks;
}

int64_t SimilarityPairs(const std::vector<ChunkSpan>& chunks) {
  int64_t pairs = 0;
  for (const ChunkSpan& chunk : chunks) {
    pairs += int64_t{chunk.sources()} * chunk.destinations();
  }
  return pairs;
}

absl::Status WriteWorkloadNpy(const Workload& workload, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat(dir, ": ", error.message()));
  const std::vector<int64_t> shape = {workload.spec.heads, workload.spec.tokens,
                                      workload.spec.dim};
  absl::Status status =
      WriteNpy(dir + "/keys.npy", NpyType::kFloat16, shape, workload.keys.data());
  if (!status.ok()) return status;
  return WriteNpy(dir + "/values.npy", NpyType::kFloat16, shape, workload.values.data());
}

}  // namespace centroidkv::bench
