// CallerGate: bearer tokens, certificate and unix-peer identities, and the per-caller
// stream slot taken at the start of each stream.
#include "service/security/caller_gate.h"

#include <grpcpp/security/auth_context.h>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace centroidkv::service {
namespace {

constexpr char kAnonymous[] = "anonymous";
// The label of calls refused before they had an identity (never the token itself).
constexpr char kUnauthenticated[] = "unauthenticated";

std::optional<std::string> BearerToken(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) return std::nullopt;
  return std::string(value);
}

}  // namespace

void CallerGate::SetTokens(std::unique_ptr<TokenTable> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(tokens);
}

absl::Status CallerGate::ReloadTokens() {
  std::shared_ptr<TokenTable> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens = tokens_;
  }
  if (tokens == nullptr) {
    return absl::FailedPreconditionError("auth_tokens_file: no tokens file to reload");
  }
  return tokens->Reload();
}

void CallerGate::SetPeerUidLookup(
    std::function<std::optional<uint32_t>(const std::string&)> lookup) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_uid_ = std::move(lookup);
}

std::optional<std::string> CallerGate::PeerIdentity(
    const grpc::CallbackServerContext& context) const {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    // mTLS: the client certificate's subject common name.
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      if (name.size() > 0) return std::string(name.data(), name.size());
    }
  }
  std::function<std::optional<uint32_t>(const std::string&)> lookup;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lookup = peer_uid_;
  }
  if (lookup) {
    if (std::optional<uint32_t> uid = lookup(context.peer()); uid.has_value()) {
      return absl::StrCat("uid:", *uid);
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::string> CallerGate::Identify(const grpc::CallbackServerContext& context,
                                                 const char* rpc) {
  std::shared_ptr<TokenTable> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens = tokens_;
  }
  std::string caller;
  if (tokens != nullptr) {
    std::optional<std::string> token = BearerToken(context);
    std::optional<std::string> name;
    if (token.has_value()) name = tokens->Lookup(*token);
    if (!name.has_value()) {
      metrics_->CallerRequest(kUnauthenticated, rpc);
      metrics_->CallerRejected(kUnauthenticated, token.has_value() ? "bad_token" : "no_token");
      return absl::UnauthenticatedError(
          token.has_value()
              ? "authorization: the bearer token is not accepted by this server"
              : "authorization: this server requires 'authorization: Bearer <token>' metadata");
    }
    caller = *std::move(name);
  } else {
    caller = PeerIdentity(context).value_or(kAnonymous);
  }
  metrics_->CallerRequest(caller, rpc);
  return caller;
}

absl::StatusOr<std::unique_ptr<CallerStream>> CallerGate::OpenStream(
    const grpc::CallbackServerContext& context) {
  absl::StatusOr<std::string> caller = Identify(context, "Compress");
  if (!caller.ok()) return caller.status();
  absl::StatusOr<std::unique_ptr<CallerStream>> stream = registry_.OpenStream(*caller);
  if (!stream.ok()) metrics_->CallerRejected(*caller, "stream_limit");
  return stream;
}

}  // namespace centroidkv::service
