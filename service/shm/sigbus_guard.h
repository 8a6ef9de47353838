// Survives a client truncating a shared memory region's file while the server touches it
// (the wl_shm problem of Wayland compositors). A same-uid client may ftruncate its region
// file at any time; the server's next access to a page past the new end raises SIGBUS, which
// would kill the server. A process-wide SIGBUS handler (installed once, on the first guarded
// range) looks the faulting address up in a fixed table of guarded ranges; inside one, it maps
// anonymous zero pages over that range's whole mapping (mmap MAP_FIXED | MAP_PRIVATE |
// MAP_ANONYMOUS), marks the range truncated and returns, so the faulting load or store
// continues on a zero page. The jobs that used the range check the mark when they end and
// fail (JobRegionMemory::CheckIntact); the range never maps the file again, so it stays
// unusable. Faults outside every range go to the handler installed before ours (ASan's, for
// example), or to the default action (the process dies with SIGBUS, as without the guard).
//
// The handler is async-signal-safe: it reads atomics, calls mmap(2) through syscall(2)
// (no sanitizer interceptor) and sigaction(2); no lock, no allocation. Register and release
// are cheap (a scan of the table), thread-safe, and never run inside the handler.
// Under sanitizers: ASan's and TSan's sigaction interceptors keep our handler as the user's
// (ASan's default handle_sigbus=1 chains; only handle_sigbus=2, "exclusive", would drop it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace centroidkv::service {

// One guarded range (the whole mapping of one region). Movable; releases its slot on
// destruction, which must happen before the range is unmapped.
class SigbusGuard {
 public:
  // At most this many ranges are guarded at once in the process.
  static constexpr int kMaxRanges = 8192;

  // Guards the page-aligned [start, start + bytes). RESOURCE_EXHAUSTED when kMaxRanges
  // ranges are guarded already; INTERNAL when the handler cannot be installed.
  static absl::StatusOr<SigbusGuard> Guard(void* start, size_t bytes);

  SigbusGuard() = default;
  SigbusGuard(SigbusGuard&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  SigbusGuard& operator=(SigbusGuard&& other) noexcept;
  ~SigbusGuard() { Release(); }

  // Whether an access to the range faulted because its file was truncated: the range now
  // holds zero pages (and keeps them).
  bool truncated() const;
  // The first address that faulted (0: none).
  uintptr_t fault_address() const;
  // Stops guarding (waits for a handler that is looking at the range to finish).
  void Release();

 private:
  explicit SigbusGuard(int slot) : slot_(slot) {}
  int slot_ = -1;
};

}  // namespace centroidkv::service
