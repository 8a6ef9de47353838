// SigbusGuard (service/shm/sigbus_guard.h) on real file mappings: a mapping whose file is
// truncated under it reads and writes zero pages instead of killing the process, and is
// marked; an unguarded (or released) mapping still dies of the fault (the handler chains to
// the previous disposition: the default, or ASan's under ASan); the table is bounded.
#include "service/shm/sigbus_guard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv::service {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A file of `pages` pages of 0xab under /dev/shm (unlinked at once), mapped shared.
struct MappedFile {
  explicit MappedFile(size_t pages) : bytes(pages * kPage) {
    const std::string path =
        "/dev/shm/ckv-sigbus-guard-test-" + std::to_string(getpid()) + "-" + std::to_string(++n);
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    unlink(path.c_str());
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(mapping, MAP_FAILED) << std::strerror(errno);
    data = static_cast<volatile uint8_t*>(mapping);
    std::memset(mapping, 0xab, bytes);
  }
  ~MappedFile() {
    munmap(const_cast<uint8_t*>(data), bytes);
    close(fd);
  }
  // What the owning client does: shrinks the file under the mapping.
  void Truncate(size_t new_bytes) const {
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(new_bytes)), 0) << std::strerror(errno);
  }
  static inline int n = 0;
  size_t bytes;
  int fd = -1;
  volatile uint8_t* data = nullptr;
};

TEST(SigbusGuardTest, TruncatedFileLeavesZeroPagesAndAMark) {
  MappedFile file(4);
  absl::StatusOr<SigbusGuard> guard =
      SigbusGuard::Guard(const_cast<uint8_t*>(file.data), file.bytes);
  ASSERT_TRUE(guard.ok()) << guard.status();
  EXPECT_EQ(file.data[3 * kPage], 0xab);
  EXPECT_FALSE(guard->truncated());

  file.Truncate(kPage);  // pages 1-3 are past the file's end now
  EXPECT_EQ(file.data[2 * kPage + 5], 0);  // SIGBUS without the guard
  EXPECT_TRUE(guard->truncated());
  EXPECT_EQ(guard->fault_address(), reinterpret_cast<uintptr_t>(&file.data[2 * kPage + 5]));
  // The whole range holds zero pages now, the page still in the file too, and takes writes.
  EXPECT_EQ(file.data[0], 0);
  file.data[3 * kPage] = 7;
  EXPECT_EQ(file.data[3 * kPage], 7);
  // Growing the file back does not bring the mapping back: the mark stays.
  file.Truncate(file.bytes);
  EXPECT_EQ(file.data[kPage], 0);
  EXPECT_TRUE(guard->truncated());
}

TEST(SigbusGuardTest, UntouchedPagesPastTheEndLeaveNoMark) {
  MappedFile file(2);
  absl::StatusOr<SigbusGuard> guard =
      SigbusGuard::Guard(const_cast<uint8_t*>(file.data), file.bytes);
  ASSERT_TRUE(guard.ok()) << guard.status();
  file.Truncate(kPage);
  EXPECT_EQ(file.data[10], 0xab);  // still in the file
  EXPECT_FALSE(guard->truncated());
  EXPECT_EQ(guard->fault_address(), 0u);
}

// A fault the guard does not own still kills the process: on an unguarded mapping, and on
// one whose guard was released (the handler is installed by then, so it chains).
TEST(SigbusGuardDeathTest, FaultsOutsideGuardedRangesStillKill) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  MappedFile guarded(2);
  absl::StatusOr<SigbusGuard> guard =
      SigbusGuard::Guard(const_cast<uint8_t*>(guarded.data), guarded.bytes);
  ASSERT_TRUE(guard.ok()) << guard.status();
  MappedFile unguarded(2);
  unguarded.Truncate(0);
  EXPECT_DEATH((void)unguarded.data[kPage], "");
  guard->Release();
  EXPECT_FALSE(guard->truncated());
  guarded.Truncate(0);
  EXPECT_DEATH((void)guarded.data[kPage], "");
}

TEST(SigbusGuardTest, TableIsBoundedAndReleasedSlotsAreReused) {
  // Ranges that never fault need no mapping: addresses far apart, page-sized.
  std::vector<SigbusGuard> guards;
  uintptr_t address = uintptr_t{1} << 40;
  absl::Status refused;
  for (int i = 0; i <= SigbusGuard::kMaxRanges; ++i, address += kPage) {
    absl::StatusOr<SigbusGuard> guard = SigbusGuard::Guard(reinterpret_cast<void*>(address), kPage);
    if (!guard.ok()) {
      refused = guard.status();
      break;
    }
    guards.push_back(*std::move(guard));
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_LE(guards.size(), static_cast<size_t>(SigbusGuard::kMaxRanges));
  guards.pop_back();  // released: its slot is free again
  EXPECT_TRUE(SigbusGuard::Guard(reinterpret_cast<void*>(address), kPage).ok());
}

}  // namespace
}  // namespace centroidkv::service
