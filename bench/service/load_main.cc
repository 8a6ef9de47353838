// centroidkv-bench: see bench/service/load.h.
#include <iostream>
#include <string>
#include <vector>

#include "bench/service/load.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return centroidkv::bench::BenchMain(args, std::cout, std::cerr);
}
