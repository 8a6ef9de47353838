// /metrics over TLS: when the gRPC port serves TLS (--tls-cert/--tls-key), the metrics
// port serves HTTPS with the same certificate and key, so that caller names and load
// figures never cross the network in the clear. Like gRPC's file watcher provider, the
// files are re-read (at most every tls_refresh_seconds, on the next TLS handshake) and a
// changed pair is served without a restart; a pair that does not load (half-written
// files, a key that does not match) leaves the previous one in force. No client
// certificate is asked for: scrapers verify the server, /metrics holds no secrets.
// --metrics-plaintext keeps plain HTTP, and is accepted with TLS only on a loopback
// address (a scraper in the same pod or host).
//
// Thread-safety: handshakes may run on several threads; the key pair is swapped under a
// mutex.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "service/server_options.h"

struct ssl_st;
struct ssl_ctx_st;

namespace centroidkv::service {

// The certificate files the metrics port serves.
struct MetricsTlsFiles {
  std::string cert_file;  // PEM chain, leaf first
  std::string key_file;   // PEM private key of the leaf
  std::chrono::seconds refresh{60};
};

// How /metrics is served for `options`: the TLS files when the gRPC port uses TLS and
// --metrics-plaintext is not set, nullopt for plain HTTP. InvalidArgument naming
// metrics_plaintext when plain HTTP is asked for with TLS on a non-loopback address.
absl::StatusOr<std::optional<MetricsTlsFiles>> MetricsTlsFor(const ServerOptions& options);

// True for 127.0.0.0/8, ::1 and localhost ("HOST:PORT", IPv6 in brackets).
bool IsLoopbackAddress(const std::string& address);

class ReloadingKeyPair;  // metrics_tls.cc

// The OpenSSL context of the metrics port: TLS 1.2 or later, presenting the pair in `files`,
// re-read as described above, on every new connection.
class MetricsTlsContext {
 public:
  // InvalidArgument naming tls_cert / tls_key when the files do not load.
  static absl::StatusOr<std::unique_ptr<MetricsTlsContext>> Create(const MetricsTlsFiles& files);
  ~MetricsTlsContext();
  MetricsTlsContext(const MetricsTlsContext&) = delete;
  MetricsTlsContext& operator=(const MetricsTlsContext&) = delete;

  // A server-side TLS connection over the non-blocking socket `fd` (not owned; the handshake
  // runs within the first reads and writes), with partial writes enabled; null when OpenSSL
  // cannot make one. The caller frees it with SSL_free.
  ssl_st* NewConnection(int fd) const;

 private:
  MetricsTlsContext() = default;

  std::shared_ptr<ReloadingKeyPair> pair_;  // read by the context's certificate callback
  ssl_ctx_st* context_ = nullptr;
};

}  // namespace centroidkv::service
