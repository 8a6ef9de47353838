// Test helper: one real centroidkv-server child process (the binary from CKV_BIN_DIR) with
// its output in a log file, for the tests that need a separate process: signals, exit
// codes, two servers competing for one address.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace centroidkv::testing {

class ServerProcess {
 public:
  ServerProcess();
  ~ServerProcess();  // SIGKILLs the process if it is still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts centroidkv-server with `args` and waits (up to 20 s) for its "listening" line.
  // False if it exited first (see exit_status() and Log()) or never said it listens.
  bool Start(const std::vector<std::string>& args);
  // The address its log says clients dial ("127.0.0.1:PORT" or "unix:///path").
  const std::string& target() const { return target_; }
  std::string Log() const;
  void Signal(int signal_number) const;
  // Waits up to `timeout` for the process to exit; true if it did.
  bool WaitExit(std::chrono::milliseconds timeout);
  bool exited() const { return exited_; }
  int exit_status() const { return status_; }  // waitpid's status, once exited
  pid_t pid() const { return pid_; }
  // User + system CPU time the process has used so far (/proc/PID/stat).
  double CpuSeconds() const;
  // Its resident set size now (/proc/PID/status VmRSS); 0 once it is gone.
  uint64_t RssBytes() const;

 private:
  std::string log_path_;
  std::string target_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
};

}  // namespace centroidkv::testing
