// ServerProcess: fork + execv of centroidkv-server, its log polled for the listening line.
#include "tests/testing/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <thread>

#include "centroidkv/common/process_memory.h"

namespace centroidkv::testing {
namespace {
using Clock = std::chrono::steady_clock;
std::atomic<int> next_log{0};
}  // namespace

ServerProcess::ServerProcess()
    : log_path_("/tmp/ckv-server-process-" + std::to_string(getpid()) + "-" +
                std::to_string(next_log.fetch_add(1)) + ".log") {}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  unlink(log_path_.c_str());
}

bool ServerProcess::Start(const std::vector<std::string>& args) {
  std::vector<std::string> all = {std::string(CKV_BIN_DIR) + "/centroidkv-server"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : all) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log < 0) return false;
  pid_ = fork();
  if (pid_ == 0) {  // only async-signal-safe calls until exec
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log);
  if (pid_ < 0) return false;
  const std::regex dials(R"(this host dials (\S+)\))");
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < give_up) {
    std::smatch match;
    const std::string text = Log();
    if (std::regex_search(text, match, dials)) {
      target_ = match[1];
      return true;
    }
    if (WaitExit(std::chrono::milliseconds(0))) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void ServerProcess::Signal(int signal_number) const {
  if (pid_ > 0 && !exited_) kill(pid_, signal_number);
}

bool ServerProcess::WaitExit(std::chrono::milliseconds timeout) {
  const auto give_up = Clock::now() + timeout;
  while (!exited_) {
    if (waitpid(pid_, &status_, WNOHANG) == pid_) {
      exited_ = true;
      break;
    }
    if (Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exited_;
}

double ServerProcess::CpuSeconds() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces, so start after its ')').
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

uint64_t ServerProcess::RssBytes() const { return ResidentBytes(pid_); }

}  // namespace centroidkv::testing
