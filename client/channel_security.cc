// Channel credentials, server-name override and the bearer token interceptor.
#include "client/channel_security.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace centroidkv::client {
namespace {

// How often the client re-reads its certificate files (a rotated secret).
constexpr unsigned int kRefreshSeconds = 60;

absl::Status CheckReadable(const std::string& path, const char* option) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(option, ": cannot read '", path, "'"));
  }
  return absl::OkStatus();
}

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::shared_ptr<const std::string> header)
      : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<const std::string> header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token)
      : header_(std::make_shared<const std::string>(absl::StrCat("Bearer ", token))) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  const std::shared_ptr<const std::string> header_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key: give both or neither");
  }
  if (options.tls_ca.empty() && options.tls_cert.empty()) {
    if (!options.tls_server_name.empty()) {
      return absl::InvalidArgumentError("tls_server_name: needs TLS (--tls-ca)");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (!options.tls_ca.empty()) {
    if (absl::Status s = CheckReadable(options.tls_ca, "tls_ca"); !s.ok()) return s;
  }
  if (!options.tls_cert.empty()) {
    if (absl::Status s = CheckReadable(options.tls_cert, "tls_cert"); !s.ok()) return s;
    if (absl::Status s = CheckReadable(options.tls_key, "tls_key"); !s.ok()) return s;
  }
  // Without tls_ca the server is verified against the system's roots.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.tls_key, options.tls_cert, options.tls_ca, kRefreshSeconds);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  if (!options.tls_ca.empty()) tls.watch_root_certs();
  if (!options.tls_cert.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(tls);
}

void AddSecurityChannelArgs(const ClientOptions& options, grpc::ChannelArguments* args) {
  if (!options.tls_server_name.empty()) args->SetSslTargetNameOverride(options.tls_server_name);
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
MakeAuthInterceptors(const ClientOptions& options) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  if (!options.auth_token.empty()) {
    factories.push_back(std::make_unique<BearerTokenFactory>(options.auth_token));
  }
  return factories;
}

}  // namespace centroidkv::client
