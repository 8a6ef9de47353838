// The resident set size of a process, from /proc/PID/status (Linux): what the memory tests
// and the soak sample of a server they run. Thread-safe: reads a file.
#pragma once

#include <cstdint>

namespace centroidkv {

// VmRSS of process `pid` in bytes; 0 when it cannot be read (the process is gone).
uint64_t ResidentBytes(int64_t pid);

}  // namespace centroidkv
