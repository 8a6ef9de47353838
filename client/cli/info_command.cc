// `centroidkv info --server ADDR`: what GetInfo reports.
#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "client/cli/commands.h"
#include "client/cli/security_flags.h"

namespace centroidkv::cli {

void AddInfoCommand(CLI::App& app, int* exit_code) {
  auto target = std::make_shared<std::string>("127.0.0.1:50051");
  auto timeout_s = std::make_shared<double>(10.0);
  auto security = std::make_shared<client::SecurityFlags>();
  CLI::App* info = app.add_subcommand("info", "Show a server's version, backends and limits");
  info->add_option("--server", *target,
                   "Server address (HOST:PORT or unix:///path), or replicas to balance over: "
                   "HOST:PORT,HOST:PORT,... or dns:///NAME:PORT")
      ->capture_default_str();
  info->add_option("--timeout", *timeout_s,
                   "Seconds to wait for the server to become reachable (probes use ~2)")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  client::AddSecurityFlags(info, security.get());
  info->callback([target, timeout_s, security, exit_code] {
    client::ClientOptions options;
    options.target = *target;
    client::ApplySecurityFlags(*security, &options);
    options.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1e3));
    auto connected = client::ConnectTarget(options);
    if (!connected.ok()) {
      std::cerr << "centroidkv info: " << connected.status().ToString() << "\n";
      *exit_code = 2;
      return;
    }
    auto info = (*connected)->GetInfo();
    if (!info.ok()) {
      std::cerr << "centroidkv info: " << info.status().ToString() << "\n";
      *exit_code = 2;
      return;
    }
    std::cout << "version:          " << info->version << "\n"
              << "backends:         " << absl::StrJoin(info->backends, ", ") << "\n"
              << "default backend:  " << info->default_backend << "\n"
              << "devices:          " << (info->device_info.empty() ? "none" : "") << "\n";
    for (const client::ServerDevice& device : info->device_info) {
      std::cout << "  " << device.backend << ": " << device.name << ", "
                << absl::StrFormat("%.1f", static_cast<double>(device.memory_bytes) / (1 << 30))
                << " GiB, compute capability " << device.compute_major << "."
                << device.compute_minor << "\n";
    }
    std::cout << "worker threads:   " << info->worker_threads << "\n"
              << "max job bytes:    " << info->max_job_bytes << "\n"
              << "max stream bytes: " << info->max_stream_bytes << "\n"
              << "max total bytes:  " << info->max_total_bytes << "\n"
              << "max message:      " << info->max_message_bytes << "\n"
              << "max heads/tokens/dim: " << info->max_heads << " / " << info->max_tokens
              << " / " << info->max_dim << "\n";
  });
}

}  // namespace centroidkv::cli
