// ResidentBytes: VmRSS from /proc/PID/status.
#include "centroidkv/common/process_memory.h"

#include <fstream>
#include <string>

namespace centroidkv {

uint64_t ResidentBytes(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

}  // namespace centroidkv
