// Loading a llama2.c checkpoint: header validation, size check, tensor offsets.
#include "worker/model.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace centroidkv::worker {
namespace {

constexpr int64_t kHeaderBytes = 7 * sizeof(int32_t);
// Bounds that keep every size product far from int64 overflow; real models are far below.
constexpr int32_t kMaxWidth = 1 << 20;  // dim, hidden_dim, |vocab_size|
constexpr int32_t kMaxLayers = 1 << 12;
constexpr int32_t kMaxSeqLen = 1 << 24;

absl::Status CheckRange(const char* field, int32_t value, int32_t max) {
  if (value <= 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, " in the header must be in [1, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const ModelConfig& c) {
  for (absl::Status status :
       {CheckRange("dim", c.dim, kMaxWidth), CheckRange("hidden_dim", c.hidden_dim, kMaxWidth),
        CheckRange("n_layers", c.n_layers, kMaxLayers), CheckRange("n_heads", c.n_heads, c.dim),
        CheckRange("n_kv_heads", c.n_kv_heads, c.n_heads),
        CheckRange("vocab_size", c.vocab_size, kMaxWidth),
        CheckRange("seq_len", c.seq_len, kMaxSeqLen)}) {
    if (!status.ok()) return status;
  }
  if (c.dim % c.n_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dim = ", c.dim, " is not a multiple of n_heads = ", c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_heads = ", c.n_heads, " is not a multiple of n_kv_heads = ", c.n_kv_heads));
  }
  if (c.head_size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head size dim / n_heads = ", c.head_size(), " must be even for RoPE"));
  }
  return absl::OkStatus();
}

float RopeThetaOfTable(const float* table, int32_t seq_len, int32_t head_size) {
  constexpr float kLlama2cBase = 10000.0f;
  const int64_t half = head_size / 2, n = int64_t{seq_len} * half;
  if (seq_len < 2 || half < 2) return kLlama2cBase;
  const double angle = std::atan2(static_cast<double>(table[2 * n - 1]),
                                  static_cast<double>(table[n - 1]));
  const double frequency = angle / (seq_len - 1);
  if (!(frequency > 0.0)) return kLlama2cBase;
  const double theta = std::pow(frequency, -static_cast<double>(head_size) / (head_size - 2));
  // 4 significant digits
  const double scale = std::pow(10.0, std::floor(std::log10(theta)) - 3.0);
  return static_cast<float>(std::round(theta / scale) * scale);
}

int64_t CheckpointFloatCount(const ModelConfig& c) {
  const int64_t d = c.dim, f = c.hidden_dim, l = c.n_layers, v = c.vocab_size;
  const int64_t kv = c.kv_dim();
  int64_t count = v * d;                        // embedding
  count += l * d;                               // rms_att
  count += l * d * d + 2 * l * kv * d;          // wq, wk, wv
  count += l * d * d;                           // wo
  count += l * d;                               // rms_ffn
  count += 3 * l * f * d;                       // w1, w2, w3
  count += d;                                   // rms_final
  count += int64_t{c.seq_len} * c.head_size();  // legacy RoPE cos + sin, [S, hs/2] each
  if (!c.shared_classifier) count += v * d;
  return count;
}

int64_t Model::ParameterCount() const {
  const ModelConfig& c = config_;
  return CheckpointFloatCount(c) - int64_t{c.seq_len} * c.head_size();
}

absl::StatusOr<Model> ParseModel(const std::string& bytes, const std::string& name) {
  if (static_cast<int64_t>(bytes.size()) < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", bytes.size(), " bytes is too short for the 28-byte llama2.c header"));
  }
  int32_t header[7];
  std::memcpy(header, bytes.data(), sizeof(header));
  Model model;
  ModelConfig& c = model.config_;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.shared_classifier = header[5] > 0;
  c.vocab_size = header[5] == INT32_MIN ? 0 : std::abs(header[5]);
  c.seq_len = header[6];
  if (absl::Status status = ValidateConfig(c); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.message()));
  }
  const int64_t floats = CheckpointFloatCount(c);
  const int64_t expected = kHeaderBytes + floats * static_cast<int64_t>(sizeof(float));
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": file has ", bytes.size(), " bytes but the header's shapes (dim ",
                     c.dim, ", hidden_dim ", c.hidden_dim, ", n_layers ", c.n_layers, ", n_heads ",
                     c.n_heads, ", n_kv_heads ", c.n_kv_heads, ", vocab_size ", header[5],
                     ", seq_len ", c.seq_len, ") need ", expected));
  }
  model.weights_.resize(static_cast<size_t>(floats));
  std::memcpy(model.weights_.data(), bytes.data() + kHeaderBytes,
              static_cast<size_t>(floats) * sizeof(float));
  for (int64_t i = 0; i < floats; ++i) {
    if (!std::isfinite(model.weights_[static_cast<size_t>(i)])) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": weight float ", i, " is not finite"));
    }
  }
  const int64_t d = c.dim, f = c.hidden_dim, l = c.n_layers, kv = c.kv_dim();
  int64_t offset = 0;
  auto take = [&offset](int64_t size) {
    const int64_t start = offset;
    offset += size;
    return start;
  };
  model.embedding_ = take(int64_t{c.vocab_size} * d);
  model.rms_att_ = take(l * d);
  model.wq_ = take(l * d * d);
  model.wk_ = take(l * kv * d);
  model.wv_ = take(l * kv * d);
  model.wo_ = take(l * d * d);
  model.rms_ffn_ = take(l * d);
  model.w1_ = take(l * f * d);
  model.w2_ = take(l * d * f);
  model.w3_ = take(l * f * d);
  model.rms_final_ = take(d);
  const int64_t table = take(int64_t{c.seq_len} * c.head_size());  // legacy RoPE table
  c.rope_theta = RopeThetaOfTable(model.weights_.data() + table, c.seq_len, c.head_size());
  model.classifier_ = c.shared_classifier ? model.embedding_ : take(int64_t{c.vocab_size} * d);
  return model;
}

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return std::move(buffer).str();
}

absl::StatusOr<Model> LoadModel(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  return ParseModel(*bytes, path);
}

}  // namespace centroidkv::worker
