// Reading and writing numpy .npy files (format versions 1.0, 2.0 and 3.0), the exchange
// format of the CLI and of ../shared/golden. Only little-endian, C-order arrays of the
// element types below; anything else is a clear InvalidArgument naming the file.
// Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace centroidkv {

enum class NpyType : uint8_t { kFloat32, kFloat16, kUInt32, kInt32, kInt64, kUInt64, kUInt8 };

// numpy's descr string for the type, e.g. "<f4".
std::string NpyDescr(NpyType type);
int32_t NpyTypeSize(NpyType type);

struct NpyArray {
  NpyType type = NpyType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // raw little-endian data, C order

  int64_t NumElements() const;
  template <typename T>
  const T* As() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
// Parses an in-memory .npy image; `name` is used in error messages.
absl::StatusOr<NpyArray> ParseNpy(const std::string& name, const std::vector<uint8_t>& file);

// Writes `data` (NumElements(shape) elements of `type`, C order) as a version 1.0 .npy.
absl::Status WriteNpy(const std::string& path, NpyType type,
                      const std::vector<int64_t>& shape, const void* data);

}  // namespace centroidkv
