// A program that links ckv_client and nothing else of the project, as an inference worker
// would: ckv_client_link_closure (link_closure_check.cmake) inspects its binary.
#include <cstdio>

#include "centroidkv/client/client.h"

int main(int argc, char** argv) {
  centroidkv::client::ClientOptions options;
  if (argc > 1) options.target = argv[1];
  options.connect_timeout = std::chrono::milliseconds(1);
  auto client = centroidkv::client::Client::Connect(options);
  std::printf("%s\n", client.ok() ? "connected" : std::string(client.status().message()).c_str());
  return 0;
}
