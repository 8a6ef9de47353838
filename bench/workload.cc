#include "bench/workload.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"

namespace centroidkv::bench {
namespace {

void FillHead(const WorkloadSpec& spec, uint64_t stream, uint16_t* out) {
  // splitmix-style spreading so that neighbouring streams get unrelated generators.
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::uniform_int_distribution<int32_t> pick(0, spec.topics - 1);
  std::vector<float> topics(static_cast<size_t>(spec.topics) * spec.dim);
  for (float& x : topics) x = normal(rng);
  const float noise = static_cast<float>(spec.noise);
  int32_t topic = pick(rng);
  for (int32_t t = 0; t < spec.tokens; ++t) {
    if (uniform(rng) > spec.stay) topic = pick(rng);
    const float* direction = &topics[static_cast<size_t>(topic) * spec.dim];
    uint16_t* row = out + static_cast<size_t>(t) * spec.dim;
    for (int32_t j = 0; j < spec.dim; ++j) row[j] = FloatToHalf(direction[j] + noise * normal(rng));
  }
}

}  // namespace

LayerView Workload::View() const {
  LayerView view;
  view.dtype = DType::kFloat16;
  view.layout = TensorLayout::kHeadMajor;
  view.num_heads = spec.heads;
  view.num_tokens = spec.tokens;
  view.key_dim = spec.dim;
  view.value_dim = spec.dim;
  view.keys = keys.data();
  view.values = values.data();
  view.counts = nullptr;  // fresh tokens: every count is 1
  return view;
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
