// TestPki: openssl commands for the test CAs and certificates.
#include "tests/testing/test_pki.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace centroidkv::test {

absl::StatusOr<TestPki> TestPki::Create() {
  char pattern[] = "/tmp/ckv-pki-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  TestPki pki{std::string(pattern)};
  for (const char* ca : {"ca", "other-ca"}) {
    if (absl::Status s = pki.MakeCa(ca); !s.ok()) return s;
  }
  struct Leaf {
    const char* name;
    const char* ca;
    bool server;
    int days;
  };
  for (const Leaf& leaf : {Leaf{"server", "ca", true, 2}, Leaf{"server-other", "other-ca", true, 2},
                           Leaf{"worker-a", "ca", false, 2}, Leaf{"worker-b", "ca", false, 2},
                           Leaf{"intruder", "other-ca", false, 2},
                           Leaf{"expired", "ca", false, -1}}) {
    if (absl::Status s = pki.MakeLeaf(leaf.name, leaf.ca, leaf.server, leaf.days); !s.ok()) {
      return s;
    }
  }
  return pki;
}

TestPki* TestPkiSuite::pki_ = nullptr;

void TestPkiSuite::SetUpTestSuite() {
  absl::StatusOr<TestPki> pki = TestPki::Create();
  ASSERT_TRUE(pki.ok()) << pki.status();
  pki_ = new TestPki(*std::move(pki));
}

void TestPkiSuite::TearDownTestSuite() {
  delete pki_;
  pki_ = nullptr;
}

TestPki::TestPki(TestPki&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }

TestPki::~TestPki() {
  if (dir_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status TestPki::Run(const std::string& command) const {
  const std::string log = dir_ + "/openssl.log";
  const std::string line = absl::StrCat("cd '", dir_, "' && ", command, " >", log, " 2>&1");
  if (std::system(line.c_str()) != 0) {
    std::ifstream in(log);
    std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return absl::InternalError(absl::StrCat("'", command, "' failed: ", output));
  }
  return absl::OkStatus();
}

absl::Status TestPki::MakeCa(const std::string& name) const {
  return Run(absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
      name, ".key -out ", name, ".pem -days 2 -subj /CN=centroidkv-test-", name,
      " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"));
}

absl::Status TestPki::MakeLeaf(const std::string& name, const std::string& ca, bool server,
                               int days) const {
  const std::string ext = name + ".ext";
  {
    std::ofstream out(dir_ + "/" + ext);
    out << "basicConstraints=CA:FALSE\n"
        << "keyUsage=critical,digitalSignature,keyEncipherment\n"
        << "extendedKeyUsage=" << (server ? "serverAuth" : "clientAuth") << "\n";
    if (server) out << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  const std::string cn = server ? "centroidkv-server" : name;
  if (absl::Status s = Run(absl::StrCat(
          "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
          ".key -out ", name, ".csr -subj /CN=", cn));
      !s.ok()) {
    return s;
  }
  // -days -1: the certificate's validity ended a day before it was made.
  return Run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                          ".key -CAcreateserial -days ", days, " -extfile ", ext, " -out ", name,
                          ".pem"));
}

}  // namespace centroidkv::test
