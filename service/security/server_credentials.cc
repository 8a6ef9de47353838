// MakeServerCredentials: plaintext, TLS or mTLS from SecurityOptions.
#include "service/security/server_credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace centroidkv::service {
namespace {

absl::Status CheckReadable(const std::string& path, const char* flag) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key: give both or neither");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "tls_client_ca: mTLS needs the server's own --tls-cert and --tls-key");
  }
  if (!UsesTls(options)) return grpc::InsecureServerCredentials();
  if (options.tls_refresh_seconds < 1) {
    return absl::InvalidArgumentError("tls_refresh_seconds: must be at least 1");
  }
  if (absl::Status s = CheckReadable(options.tls_cert, "tls_cert"); !s.ok()) return s;
  if (absl::Status s = CheckReadable(options.tls_key, "tls_key"); !s.ok()) return s;
  const bool mutual = !options.tls_client_ca.empty();
  if (mutual) {
    if (absl::Status s = CheckReadable(options.tls_client_ca, "tls_client_ca"); !s.ok()) {
      return s;
    }
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.tls_key, options.tls_cert, mutual ? options.tls_client_ca : std::string(),
      static_cast<unsigned int>(options.tls_refresh_seconds));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (mutual) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

}  // namespace centroidkv::service
