// SigbusGuard: the table of guarded ranges and the SIGBUS handler that reads it.
#include "service/shm/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace centroidkv::service {
namespace {

// A slot goes kFree -> kClaimed (being filled by Guard) -> kActive (the handler may act on
// it) -> kRetiring (Release waits for handlers looking at it) -> kFree.
enum SlotState : uint32_t { kFree = 0, kClaimed, kActive, kRetiring };

struct Slot {
  std::atomic<uint32_t> state{kFree};
  std::atomic<uint32_t> handlers{0};  // handlers between their two reads of `state`
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uint32_t> truncated{0};
  std::atomic<uintptr_t> fault_address{0};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

Slot slots[SigbusGuard::kMaxRanges];
std::atomic<int> slots_used{0};  // one past the highest slot ever claimed
struct sigaction previous_action;  // written once, before our handler is installed

// The fault is not ours: what would have happened without us.
void Chain(int signal_number, siginfo_t* info, void* context) {
  if (previous_action.sa_handler == SIG_DFL || previous_action.sa_handler == SIG_IGN) {
    // Back to the old disposition; the access faults again on return and gets it (for a
    // synchronous SIGBUS the kernel treats SIG_IGN as the default: the process dies).
    sigaction(signal_number, &previous_action, nullptr);
    return;
  }
  if ((previous_action.sa_flags & SA_SIGINFO) != 0) {
    previous_action.sa_sigaction(signal_number, info, context);
  } else {
    previous_action.sa_handler(signal_number);
  }
}

// Zero pages over the slot's range if `address` is in it (and the slot active).
bool RescueIfInside(Slot& slot, uintptr_t address) {
  if (slot.state.load() != kActive) return false;
  slot.handlers.fetch_add(1);
  bool rescued = false;
  // Re-read after announcing ourselves: Release() either sees us and waits, or has already
  // retired the slot and we leave it alone (its range may be unmapped and reused).
  if (slot.state.load() == kActive) {
    const uintptr_t begin = slot.begin.load();
    const uintptr_t end = slot.end.load();
    if (address >= begin && address < end) {
      const long mapped = syscall(SYS_mmap, begin, end - begin, PROT_READ | PROT_WRITE,
                                  MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                                  0);
      if (mapped != -1) {
        uintptr_t none = 0;
        slot.fault_address.compare_exchange_strong(none, address);
        slot.truncated.store(1);
        rescued = true;
      }
    }
  }
  slot.handlers.fetch_sub(1);
  return rescued;
}

void OnSigbus(int signal_number, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  // BUS_ADRERR: an access past the end of a file mapping. Other codes (alignment, memory
  // errors) and signals sent by kill() are not ours to hide.
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    const int used = slots_used.load();
    for (int i = 0; i < used; ++i) {
      if (RescueIfInside(slots[i], address)) {
        errno = saved_errno;
        return;  // the access resumes on a zero page
      }
    }
  }
  errno = saved_errno;
  Chain(signal_number, info, context);
}

absl::Status InstallOnce() {
  static std::once_flag once;
  static int install_errno = 0;
  std::call_once(once, [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous_action) != 0) install_errno = errno;
  });
  if (install_errno != 0) {
    return absl::InternalError(absl::StrCat("shared memory: cannot install the SIGBUS handler: ",
                                            std::strerror(install_errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SigbusGuard> SigbusGuard::Guard(void* start, size_t bytes) {
  if (absl::Status installed = InstallOnce(); !installed.ok()) return installed;
  const long page = sysconf(_SC_PAGESIZE);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(start);
  const uintptr_t end = begin + (bytes + page - 1) / page * page;
  for (int i = 0; i < kMaxRanges; ++i) {
    uint32_t free = kFree;
    if (!slots[i].state.compare_exchange_strong(free, kClaimed)) continue;
    Slot& slot = slots[i];
    slot.begin.store(begin);
    slot.end.store(end);
    slot.truncated.store(0);
    slot.fault_address.store(0);
    int used = slots_used.load();
    while (used < i + 1 && !slots_used.compare_exchange_weak(used, i + 1)) {
    }
    slot.state.store(kActive);
    return SigbusGuard(i);
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "shared memory: ", kMaxRanges,
      " regions are mapped in this server already (unregister some, or wait for their jobs)"));
}

SigbusGuard& SigbusGuard::operator=(SigbusGuard&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

bool SigbusGuard::truncated() const { return slot_ >= 0 && slots[slot_].truncated.load() != 0; }

uintptr_t SigbusGuard::fault_address() const {
  return slot_ >= 0 ? slots[slot_].fault_address.load() : 0;
}

void SigbusGuard::Release() {
  if (slot_ < 0) return;
  Slot& slot = slots[slot_];
  slot.state.store(kRetiring);
  while (slot.handlers.load() != 0) std::this_thread::yield();
  slot.begin.store(0);
  slot.end.store(0);
  slot.state.store(kFree);
  slot_ = -1;
}

}  // namespace centroidkv::service
