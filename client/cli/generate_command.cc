// `centroidkv generate`: writes a synthetic layer (keys.npy, values.npy) whose tokens have
// the structure clustering exploits: runs of tokens near a shared direction, plus noise.
// For demos and benchmarks when no model is at hand; the data are labelled synthetic.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/common/synthetic_kv.h"
#include "client/cli/commands.h"

namespace centroidkv::cli {
namespace {

struct GenerateFlags {
  int32_t heads = 8;
  int32_t tokens = 4096;
  int32_t key_dim = 128;
  int32_t value_dim = 128;
  std::string dtype = "float16";
  uint64_t seed = 1;
  int32_t topics = 32;
  double noise = 0.35;
  std::string out_dir;
};

// [heads, tokens, dim] from the shared generator: stream 2h for keys, 2h + 1 for values.
std::vector<float> Synthesize(const GenerateFlags& flags, int32_t dim, int tensor_index) {
  SyntheticKvSpec spec;
  spec.tokens = flags.tokens;
  spec.seed = flags.seed;
  spec.topics = flags.topics;
  spec.noise = flags.noise;
  std::vector<float> out(static_cast<size_t>(flags.heads) * flags.tokens * dim);
  for (int32_t h = 0; h < flags.heads; ++h) {
    SynthesizeHead(spec, dim, 2 * static_cast<uint64_t>(h) + tensor_index,
                   &out[static_cast<size_t>(h) * flags.tokens * dim]);
  }
  return out;
}

int RunGenerate(const GenerateFlags& flags) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(flags.out_dir, error);
  if (error) {
    std::cerr << "centroidkv generate: " << flags.out_dir << ": " << error.message() << "\n";
    return 1;
  }
  const bool half = flags.dtype == "float16";
  struct Tensor {
    const char* name;
    int32_t dim;
    int index;  // 0 keys, 1 values
  };
  for (const Tensor& tensor : {Tensor{"keys.npy", flags.key_dim, 0},
                               Tensor{"values.npy", flags.value_dim, 1}}) {
    std::vector<float> data = Synthesize(flags, tensor.dim, tensor.index);
    const std::vector<int64_t> shape = {flags.heads, flags.tokens, tensor.dim};
    const std::string path = (fs::path(flags.out_dir) / tensor.name).string();
    absl::Status written;
    if (half) {
      std::vector<uint16_t> narrow(data.size());
      for (size_t i = 0; i < data.size(); ++i) narrow[i] = FloatToHalf(data[i]);
      written = WriteNpy(path, NpyType::kFloat16, shape, narrow.data());
    } else {
      written = WriteNpy(path, NpyType::kFloat32, shape, data.data());
    }
    if (!written.ok()) {
      std::cerr << "centroidkv generate: " << written.ToString() << "\n";
      return 1;
    }
  }
  std::cout << "wrote synthetic layer [" << flags.heads << ", " << flags.tokens << ", "
            << flags.key_dim << "/" << flags.value_dim << "] " << flags.dtype << " to "
            << flags.out_dir << "\n";
  return 0;
}

}  // namespace

void AddGenerateCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  CLI::App* cmd =
      app.add_subcommand("generate", "Write a synthetic layer (keys.npy, values.npy) for demos");
  cmd->add_option("--out", flags->out_dir, "Output folder")->required();
  cmd->add_option("--heads", flags->heads, "KV heads H")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--tokens", flags->tokens, "Tokens n")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--key-dim", flags->key_dim, "dk")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--value-dim", flags->value_dim, "dv")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", flags->dtype, "float32 or float16")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16"}));
  cmd->add_option("--topics", flags->topics, "Distinct directions per head")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--noise", flags->noise, "Noise around each direction")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Random seed")->capture_default_str();
  cmd->callback([flags, exit_code] { *exit_code = RunGenerate(*flags); });
}

}  // namespace centroidkv::cli
