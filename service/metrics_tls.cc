// The metrics port's TLS: the policy (MetricsTlsFor) and an OpenSSL context whose
// certificate is chosen per handshake (SSL_CTX_set_cert_cb) from a key pair re-read from
// its files when due.
#include "service/metrics_tls.h"

#include <arpa/inet.h>
#include <grpc/support/log.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/security/server_credentials.h"

namespace centroidkv::service {
namespace {

struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct ChainFree {
  void operator()(STACK_OF(X509) * chain) const { sk_X509_pop_free(chain, X509_free); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};

// One loaded certificate chain and its key, with the file contents they came from.
struct KeyPair {
  std::string cert_text;
  std::string key_text;
  std::unique_ptr<X509, X509Free> leaf;
  std::unique_ptr<STACK_OF(X509), ChainFree> chain;  // the certificates after the leaf
  std::unique_ptr<EVP_PKEY, KeyFree> key;
};

absl::StatusOr<std::string> ReadWhole(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
  return text.str();
}

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

absl::StatusOr<std::shared_ptr<const KeyPair>> ParsePair(std::string cert_text,
                                                         std::string key_text) {
  auto pair = std::make_shared<KeyPair>();
  pair->cert_text = std::move(cert_text);
  pair->key_text = std::move(key_text);
  std::unique_ptr<BIO, BioFree> certs = MemoryBio(pair->cert_text);
  pair->leaf.reset(PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr));
  if (pair->leaf == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("tls_cert: holds no PEM certificate");
  }
  pair->chain.reset(sk_X509_new_null());
  while (X509* next = PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain.get(), next);
  }
  ERR_clear_error();  // the end of the chain reads as an error
  std::unique_ptr<BIO, BioFree> key = MemoryBio(pair->key_text);
  pair->key.reset(PEM_read_bio_PrivateKey(key.get(), nullptr, nullptr, nullptr));
  if (pair->key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("tls_key: holds no PEM private key");
  }
  if (X509_check_private_key(pair->leaf.get(), pair->key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("tls_key: does not match the tls_cert certificate");
  }
  return std::shared_ptr<const KeyPair>(std::move(pair));
}

}  // namespace

// The pair served, re-read from its files at most every `refresh`.
class ReloadingKeyPair {
 public:
  static absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> Load(const MetricsTlsFiles& files) {
    absl::StatusOr<std::string> cert = ReadWhole(files.cert_file, "tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadWhole(files.key_file, "tls_key");
    if (!key.ok()) return key.status();
    absl::StatusOr<std::shared_ptr<const KeyPair>> pair =
        ParsePair(*std::move(cert), *std::move(key));
    if (!pair.ok()) return pair.status();
    auto reloading = std::make_shared<ReloadingKeyPair>();
    reloading->files_ = files;
    reloading->pair_ = *std::move(pair);
    reloading->next_check_ = std::chrono::steady_clock::now() + files.refresh;
    return reloading;
  }

  // The pair to present now; re-reads the files first when the refresh interval passed.
  std::shared_ptr<const KeyPair> Current() {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check_) return pair_;
    next_check_ = now + files_.refresh;
    absl::StatusOr<std::string> cert = ReadWhole(files_.cert_file, "tls_cert");
    absl::StatusOr<std::string> key = ReadWhole(files_.key_file, "tls_key");
    if (!cert.ok() || !key.ok()) {
      gpr_log(GPR_ERROR, "/metrics TLS: %s; the previous certificate stays in use",
              (!cert.ok() ? cert.status() : key.status()).ToString().c_str());
      return pair_;
    }
    if (*cert == pair_->cert_text && *key == pair_->key_text) return pair_;
    absl::StatusOr<std::shared_ptr<const KeyPair>> pair =
        ParsePair(*std::move(cert), *std::move(key));
    if (!pair.ok()) {
      // A rotation caught half-way (one file replaced, not yet the other) also lands
      // here; the next handshake after the interval tries again.
      gpr_log(GPR_ERROR, "/metrics TLS: %s; the previous certificate stays in use",
              pair.status().ToString().c_str());
      return pair_;
    }
    pair_ = *std::move(pair);
    return pair_;
  }

 private:
  MetricsTlsFiles files_;
  std::mutex mutex_;
  std::shared_ptr<const KeyPair> pair_;
  std::chrono::steady_clock::time_point next_check_;
};

namespace {

// SSL_CTX_set_cert_cb: presents the current pair on this connection.
int PresentCurrentPair(SSL* ssl, void* arg) {
  const std::shared_ptr<const KeyPair> pair = static_cast<ReloadingKeyPair*>(arg)->Current();
  if (SSL_use_certificate(ssl, pair->leaf.get()) != 1 ||
      SSL_use_PrivateKey(ssl, pair->key.get()) != 1 ||
      SSL_set1_chain(ssl, pair->chain.get()) != 1) {
    return 0;  // aborts this handshake
  }
  return 1;
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::StatusOr<std::optional<MetricsTlsFiles>> MetricsTlsFor(const ServerOptions& options) {
  if (!UsesTls(options.security)) return std::nullopt;
  if (options.metrics_plaintext) {
    if (!IsLoopbackAddress(options.metrics_listen)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics_plaintext: with --tls-cert, plain-HTTP /metrics is served only on a "
          "loopback address (127.0.0.1, ::1, localhost), not on '",
          options.metrics_listen, "'; drop --metrics-plaintext to serve it over TLS"));
    }
    return std::nullopt;
  }
  MetricsTlsFiles files;
  files.cert_file = options.security.tls_cert;
  files.key_file = options.security.tls_key;
  files.refresh = std::chrono::seconds(options.security.tls_refresh_seconds);
  return files;
}

absl::StatusOr<std::unique_ptr<MetricsTlsContext>> MetricsTlsContext::Create(
    const MetricsTlsFiles& files) {
  absl::StatusOr<std::shared_ptr<ReloadingKeyPair>> pair = ReloadingKeyPair::Load(files);
  if (!pair.ok()) return pair.status();
  std::unique_ptr<MetricsTlsContext> tls(new MetricsTlsContext());
  tls->pair_ = *std::move(pair);
  tls->context_ = SSL_CTX_new(TLS_server_method());
  if (tls->context_ == nullptr) {
    ERR_clear_error();
    return absl::InternalError("metrics_listen: cannot set up the TLS context");
  }
  SSL_CTX_set_min_proto_version(tls->context_, TLS1_2_VERSION);
  SSL_CTX_set_options(tls->context_, SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_mode(tls->context_,
                   SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_cert_cb(tls->context_, PresentCurrentPair, tls->pair_.get());
  return tls;
}

MetricsTlsContext::~MetricsTlsContext() { SSL_CTX_free(context_); }

SSL* MetricsTlsContext::NewConnection(int fd) const {
  SSL* ssl = SSL_new(context_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    ERR_clear_error();
    return nullptr;
  }
  SSL_set_accept_state(ssl);
  return ssl;
}

}  // namespace centroidkv::service
