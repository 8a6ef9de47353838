// ckv-fuzz-seeds: writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from
// valid inputs built with the project's own writers, so the committed seeds can be
// regenerated after a format change: `build-asan/bin/ckv-fuzz-seeds fuzz/corpus`.
// Small on purpose (a few KiB each): the fuzzers mutate from them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/v1/centroidkv.pb.h"
#include "worker/model.h"
#include "fuzz/stream_frames.h"

namespace {

namespace v1 = ::centroidkv::v1;
namespace fs = std::filesystem;

bool WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

// One job of a stream: shape, element size and options.
struct JobSpec {
  uint64_t job_id;
  uint32_t heads, tokens, key_dim, value_dim;
  v1::DType dtype;
  v1::Layout layout;
  bool counts;
  uint32_t slab_bytes;  // each tensor is sent in slabs of this size
};

// Deterministic, finite element bytes with clusters of similar rows.
std::string TensorBytes(const JobSpec& spec, uint32_t dim, uint32_t salt) {
  std::string bytes;
  const uint32_t elements = spec.heads * spec.tokens * dim;
  for (uint32_t i = 0; i < elements; ++i) {
    const float value = std::sin(static_cast<float>((i / dim) % 5 + salt) * 0.7f + (i % dim));
    if (spec.dtype == v1::DTYPE_FLOAT32) {
      bytes.append(reinterpret_cast<const char*>(&value), 4);
    } else {
      const uint16_t half = spec.dtype == v1::DTYPE_FLOAT16 ? centroidkv::FloatToHalf(value)
                                                            : centroidkv::FloatToBFloat16(value);
      bytes.append(reinterpret_cast<const char*>(&half), 2);
    }
  }
  return bytes;
}

void AppendSlabs(const JobSpec& spec, v1::Tensor tensor, const std::string& bytes,
                 std::string* stream) {
  for (size_t offset = 0; offset < bytes.size(); offset += spec.slab_bytes) {
    v1::CompressRequest request;
    v1::TensorSlab* slab = request.mutable_slab();
    slab->set_job_id(spec.job_id);
    slab->set_tensor(tensor);
    slab->set_byte_offset(offset);
    slab->set_data(bytes.substr(offset, spec.slab_bytes));
    centroidkv::fuzz::AppendFrame(request.SerializeAsString(), stream);
  }
}

void AppendJob(const JobSpec& spec, const v1::CompressionParams& params, v1::Backend backend,
               std::string* stream) {
  v1::CompressRequest request;
  v1::StartJob* start = request.mutable_start_job();
  start->set_job_id(spec.job_id);
  start->set_layer_index(3);
  start->set_num_heads(spec.heads);
  start->set_num_tokens(spec.tokens);
  start->set_key_dim(spec.key_dim);
  start->set_value_dim(spec.value_dim);
  start->set_dtype(spec.dtype);
  start->set_layout(spec.layout);
  start->set_has_counts(spec.counts);
  *start->mutable_params() = params;
  start->set_return_assignment(true);
  start->set_backend(backend);
  centroidkv::fuzz::AppendFrame(request.SerializeAsString(), stream);
  AppendSlabs(spec, v1::TENSOR_KEYS, TensorBytes(spec, spec.key_dim, 1), stream);
  AppendSlabs(spec, v1::TENSOR_VALUES, TensorBytes(spec, spec.value_dim, 2), stream);
  if (spec.counts) {
    std::string counts;
    for (uint32_t i = 0; i < spec.heads * spec.tokens; ++i) {
      const uint32_t count = 1 + i % 3;
      counts.append(reinterpret_cast<const char*>(&count), 4);
    }
    AppendSlabs(spec, v1::TENSOR_COUNTS, counts, stream);
  }
}

v1::CompressionParams SmallParams() {
  v1::CompressionParams params;
  params.set_target_ratio(0.5);
  params.set_chunk_size(8);
  params.set_sink_tokens(2);
  params.set_recent_tokens(2);
  return params;
}

int WriteStreamSeeds(const fs::path& dir) {
  const JobSpec fp32{1, 2, 16, 4, 4, v1::DTYPE_FLOAT32, v1::LAYOUT_HEAD_MAJOR, false, 96};
  const JobSpec fp16{2, 1, 24, 8, 4, v1::DTYPE_FLOAT16, v1::LAYOUT_TOKEN_MAJOR, true, 128};
  const JobSpec bf16{3, 2, 12, 2, 2, v1::DTYPE_BFLOAT16, v1::LAYOUT_HEAD_MAJOR, true, 40};
  std::string one, two, tokens, cancel;
  AppendJob(fp32, SmallParams(), v1::BACKEND_CPU, &one);
  AppendJob(fp16, SmallParams(), v1::BACKEND_REFERENCE, &two);
  AppendJob(bf16, SmallParams(), v1::BACKEND_AUTO, &two);
  v1::CompressionParams by_tokens = SmallParams();
  by_tokens.set_target_tokens(5);
  by_tokens.set_min_similarity(0.2);
  by_tokens.set_tighten_per_pass(0.05);
  by_tokens.set_max_passes(3);
  by_tokens.set_uniform_heads(false);
  by_tokens.add_passthrough_heads(1);
  AppendJob(fp32, by_tokens, v1::BACKEND_REFERENCE, &tokens);
  // A job started, half sent, cancelled, then another job on the same id.
  std::string partial;
  AppendJob(fp32, SmallParams(), v1::BACKEND_IDENTITY, &partial);
  cancel = partial.substr(0, partial.size() / 2);
  v1::CompressRequest request;
  request.mutable_cancel_job()->set_job_id(fp32.job_id);
  centroidkv::fuzz::AppendFrame(request.SerializeAsString(), &cancel);
  cancel += one;
  const bool ok = WriteFile(dir / "one_fp32_job", one) && WriteFile(dir / "two_half_jobs", two) &&
                  WriteFile(dir / "target_tokens", tokens) &&
                  WriteFile(dir / "cancel_then_restart", cancel);
  return ok ? 0 : 1;
}

int WriteWireSeeds(const fs::path& dir) {
  v1::StartJob start;
  start.set_job_id(7);
  start.set_num_heads(8);
  start.set_num_tokens(1024);
  start.set_key_dim(128);
  start.set_value_dim(128);
  start.set_dtype(v1::DTYPE_BFLOAT16);
  start.set_layout(v1::LAYOUT_TOKEN_MAJOR);
  start.set_output_dtype(v1::DTYPE_FLOAT16);
  start.set_backend(v1::BACKEND_CPU);
  *start.mutable_params() = SmallParams();
  bool ok = WriteFile(dir / "ratio", start.SerializeAsString());
  start.mutable_params()->set_target_tokens(100);
  start.mutable_params()->set_min_similarity(-0.5);
  start.mutable_params()->set_max_passes(2);
  start.mutable_params()->set_uniform_heads(false);
  start.mutable_params()->add_passthrough_heads(0);
  start.mutable_params()->add_passthrough_heads(5);
  ok = ok && WriteFile(dir / "tokens_passthrough", start.SerializeAsString());
  start.mutable_params()->set_chunk_size(0x80000000u);
  ok = ok && WriteFile(dir / "chunk_too_large", start.SerializeAsString());
  return ok ? 0 : 1;
}

int WriteNpySeeds(const fs::path& dir) {
  const std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7bff};
  const std::vector<int64_t> i64 = {-1, 0, 1 << 20};
  const std::vector<uint32_t> u32 = {};
  bool ok = centroidkv::WriteNpy((dir / "f4_2x3.npy").string(), centroidkv::NpyType::kFloat32,
                                 {2, 3}, f32.data()).ok();
  ok = ok && centroidkv::WriteNpy((dir / "f2_4.npy").string(), centroidkv::NpyType::kFloat16,
                                  {4}, f16.data()).ok();
  ok = ok && centroidkv::WriteNpy((dir / "i8_3x1.npy").string(), centroidkv::NpyType::kInt64,
                                  {3, 1}, i64.data()).ok();
  ok = ok && centroidkv::WriteNpy((dir / "u4_0x2.npy").string(), centroidkv::NpyType::kUInt32,
                                  {0, 2}, u32.data()).ok();
  // Version 2.0: a 4-byte header length.
  const std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  std::string v2 = std::string("\x93NUMPY\x02\x00", 8);
  const uint32_t length = static_cast<uint32_t>(header.size());
  v2.append(reinterpret_cast<const char*>(&length), 4);
  v2 += header;
  v2.append("\x05\x00\x00\x00\xff\xff\xff\xff", 8);
  ok = ok && WriteFile(dir / "i4_v2.npy", v2);
  return ok ? 0 : 1;
}

// A llama2.c checkpoint of the given shapes with small finite weights.
std::string Checkpoint(const centroidkv::worker::ModelConfig& config, int32_t header_vocab) {
  const int32_t header[7] = {config.dim,        config.hidden_dim, config.n_layers,
                             config.n_heads,    config.n_kv_heads, header_vocab,
                             config.seq_len};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  const int64_t floats = centroidkv::worker::CheckpointFloatCount(config);
  for (int64_t i = 0; i < floats; ++i) {
    const float weight = static_cast<float>(i % 17) / 16.0f - 0.5f;
    bytes.append(reinterpret_cast<const char*>(&weight), 4);
  }
  return bytes;
}

int WriteModelSeeds(const fs::path& dir) {
  centroidkv::worker::ModelConfig config;
  config.dim = 4;
  config.hidden_dim = 6;
  config.n_layers = 2;
  config.n_heads = 2;
  config.n_kv_heads = 1;
  config.vocab_size = 5;
  config.seq_len = 3;
  bool ok = WriteFile(dir / "shared_classifier.bin", Checkpoint(config, config.vocab_size));
  config.shared_classifier = false;
  ok = ok && WriteFile(dir / "own_classifier.bin", Checkpoint(config, -config.vocab_size));
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT   (writes CORPUS_ROOT/<target>/...)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  int failures = 0;
  for (auto [name, write] : {std::pair{"compress_stream", &WriteStreamSeeds},
                             std::pair{"wire_convert", &WriteWireSeeds},
                             std::pair{"npy", &WriteNpySeeds}, std::pair{"model", &WriteModelSeeds}}) {
    fs::create_directories(root / name);
    if (write(root / name) != 0) {
      std::fprintf(stderr, "ckv-fuzz-seeds: writing %s seeds failed\n", name);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
