// Certificates made at test time with the `openssl` command (Debian's openssl package,
// installed by scripts/setup.sh): two CAs, server certificates for localhost / 127.0.0.1
// from each, two client certificates from the first CA, one from the other CA and an
// expired one. Keys are P-256. Everything lives in a fresh temporary folder, removed by
// the destructor.
// Thread-compatible.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace centroidkv::test {

class TestPki {
 public:
  // Makes every file below; fails with openssl's output when a command fails.
  static absl::StatusOr<TestPki> Create();
  TestPki(TestPki&& other) noexcept;
  TestPki& operator=(TestPki&&) = delete;
  ~TestPki();

  const std::string& dir() const { return dir_; }
  // "<dir>/<name>.pem" and "<dir>/<name>.key" for each name:
  //   ca, other-ca             the two CAs (certificate only for "ca.pem", "other-ca.pem")
  //   server                   CN=centroidkv-server, SAN localhost + 127.0.0.1, from ca
  //   server-other             the same names, from other-ca (for rotation)
  //   worker-a, worker-b       client certificates (CN = the name) from ca
  //   intruder                 a client certificate from other-ca
  //   expired                  a client certificate from ca whose validity ended yesterday
  std::string Pem(const std::string& name) const { return dir_ + "/" + name + ".pem"; }
  std::string Key(const std::string& name) const { return dir_ + "/" + name + ".key"; }

 private:
  explicit TestPki(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Run(const std::string& command) const;
  absl::Status MakeCa(const std::string& name) const;
  absl::Status MakeLeaf(const std::string& name, const std::string& ca, bool server,
                        int days) const;

  std::string dir_;
};

// A fixture base whose test suite shares one TestPki, made before its first test and
// removed after its last (a fatal failure when openssl fails).
class TestPkiSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  static TestPki* pki_;
};

}  // namespace centroidkv::test
