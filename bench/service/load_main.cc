// centroidkv-bench: see bench/service/load.h.
#include <iostream>
#include <string>
#include <vector>

#include "bench/service/load.h"
#include "centroidkv/common/heap_tuning.h"

int main(int argc, char** argv) {
  // The same heap settings as centroidkv-server, for the client and the in-process engine.
  centroidkv::KeepFreedHeapMemory();
  const std::vector<std::string> args(argv + 1, argv + argc);
  return centroidkv::bench::BenchMain(args, std::cout, std::cerr);
}
