// libFuzzer target: the llama2.c checkpoint loader (worker/model.cc, ParseModel) on
// arbitrary bytes. A parse either fails with InvalidArgument naming the file or yields a
// model whose every tensor accessor stays inside the weights read (ASan checks each read).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/model.h"

namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "model_fuzzer: %s\n", what);
    std::abort();
  }
}

// Reads the first and last float of a tensor of `size` floats, so ASan sees both ends.
float Touch(const float* tensor, int64_t size) { return tensor[0] + tensor[size - 1]; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<centroidkv::worker::Model> model =
      centroidkv::worker::ParseModel(bytes, "fuzz.bin");
  if (!model.ok()) {
    Check(model.status().code() == absl::StatusCode::kInvalidArgument, "error is not INVALID_ARGUMENT");
    Check(model.status().message().find("fuzz.bin") != absl::string_view::npos,
          "error does not name the file");
    return 0;
  }
  const centroidkv::worker::ModelConfig& c = model->config();
  Check(centroidkv::worker::ValidateConfig(c).ok(), "a parsed model fails ValidateConfig");
  const int64_t d = c.dim, f = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
  const int32_t last = c.n_layers - 1;
  volatile float sink = Touch(model->embedding(), v * d) + Touch(model->classifier(), v * d) +
                        Touch(model->rms_final(), d);
  for (int32_t layer : {0, last}) {
    sink = sink + Touch(model->rms_att(layer), d) + Touch(model->wq(layer), d * d) +
           Touch(model->wk(layer), kv * d) + Touch(model->wv(layer), kv * d) +
           Touch(model->wo(layer), d * d) + Touch(model->rms_ffn(layer), d) +
           Touch(model->w1(layer), f * d) + Touch(model->w2(layer), d * f) +
           Touch(model->w3(layer), f * d);
  }
  Check(model->ParameterCount() > 0, "no parameters");
  return 0;
}
