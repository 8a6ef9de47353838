// ckv_worker_logits: the C++ reference worker's (worker) next-token logits for a token
// sequence, the oracle of tests/python/test_transformers.py.
// Usage: ckv_worker_logits MODEL OUT.f32 TOKEN... ; writes [len(TOKENS), vocab] float32
// (little-endian, row t = the logits after feeding tokens 0..t).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker/model.h"
#include "worker/transformer.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: ckv_worker_logits MODEL OUT.f32 TOKEN...\n";
    return 2;
  }
  auto model = centroidkv::worker::LoadModel(argv[1]);
  if (!model.ok()) {
    std::cerr << model.status().ToString() << "\n";
    return 1;
  }
  centroidkv::worker::Transformer transformer(*model);
  centroidkv::worker::KvCache cache = transformer.NewCache();
  std::FILE* out = std::fopen(argv[2], "wb");
  if (out == nullptr) {
    std::cerr << "cannot write " << argv[2] << "\n";
    return 1;
  }
  for (int i = 3; i < argc; ++i) {
    const absl::Status status = transformer.Forward(std::atoi(argv[i]), &cache);
    if (!status.ok()) {
      std::cerr << status.ToString() << "\n";
      std::fclose(out);
      return 1;
    }
    const std::vector<float>& logits = transformer.logits();
    std::fwrite(logits.data(), sizeof(float), logits.size(), out);
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
