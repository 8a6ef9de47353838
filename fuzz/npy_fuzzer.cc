// libFuzzer target: the .npy reader (common/npy.cc, ParseNpy) on arbitrary bytes. A parse
// either fails with InvalidArgument naming the file or yields an array whose shape and byte
// size agree; a parsed array written back with WriteNpy parses to the same array.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "centroidkv/common/npy.h"

namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "npy_fuzzer: %s\n", what);
    std::abort();
  }
}

// A per-process scratch file for the WriteNpy round trip (fuzz jobs run in parallel), in
// memory (/dev/shm) where there is one: a disk file per execution would be most of the time.
const std::string& ScratchPath() {
  static const std::string path =
      std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/ckv_npy_fuzzer_" +
      std::to_string(static_cast<long>(getpid())) + ".npy";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> file(data, data + size);
  absl::StatusOr<centroidkv::NpyArray> array = centroidkv::ParseNpy("fuzz.npy", file);
  if (!array.ok()) {
    Check(array.status().code() == absl::StatusCode::kInvalidArgument, "error is not INVALID_ARGUMENT");
    Check(array.status().message().find("fuzz.npy") != absl::string_view::npos,
          "error does not name the file");
    return 0;
  }
  const int64_t elements = array->NumElements();
  Check(elements >= 0, "negative element count");
  Check(array->bytes.size() ==
            static_cast<uint64_t>(elements) * centroidkv::NpyTypeSize(array->type),
        "byte size disagrees with the shape");
  // Round trip: what we write, we read back identically.
  if (!centroidkv::WriteNpy(ScratchPath(), array->type, array->shape, array->bytes.data()).ok()) {
    return 0;  // e.g. /tmp full: not the parser's fault
  }
  absl::StatusOr<centroidkv::NpyArray> again = centroidkv::ReadNpy(ScratchPath());
  std::remove(ScratchPath().c_str());
  Check(again.ok(), "WriteNpy's output does not parse");
  Check(again->type == array->type && again->shape == array->shape &&
            again->bytes == array->bytes,
        "round trip changed the array");
  return 0;
}
