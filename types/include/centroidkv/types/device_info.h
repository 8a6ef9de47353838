// One accelerator a backend runs on, as an engine reports it and GetInfo lists it.
// Header-only; a value type.
#pragma once

#include <cstdint>
#include <string>

namespace centroidkv {

// One accelerator a backend runs on, as GetInfo lists it.
struct DeviceInfo {
  std::string backend;  // the engine's name(), e.g. "cuda:0"
  std::string name;     // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;
  int32_t compute_major = 0;  // compute capability, e.g. 9.0
  int32_t compute_minor = 0;
};

}  // namespace centroidkv
