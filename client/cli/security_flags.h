// The client security flags shared by every client tool (centroidkv, centroidkv-bench,
// centroidkv-quality): --tls-ca, --tls-cert, --tls-key, --tls-server-name and --auth-token
// (default: $CENTROIDKV_TOKEN, so a token need not appear in process listings). A future
// Python client takes the same names. Header-only: each tool already links CLI11.
#pragma once

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "centroidkv/client/client.h"

namespace centroidkv::client {

struct SecurityFlags {
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string auth_token;
};

inline void AddSecurityFlags(CLI::App* app, SecurityFlags* flags) {
  app->add_option("--tls-ca", flags->tls_ca,
                  "TLS: CA bundle (PEM) to verify the server with; turns TLS on")
      ->group("Security");
  app->add_option("--tls-cert", flags->tls_cert,
                  "mTLS: client certificate chain (PEM), with --tls-key; turns TLS on")
      ->group("Security");
  app->add_option("--tls-key", flags->tls_key, "mTLS: private key of --tls-cert (PEM)")
      ->group("Security");
  app->add_option("--tls-server-name", flags->tls_server_name,
                  "TLS: name the server certificate must carry (default: the target's host)")
      ->group("Security");
  app->add_option("--auth-token", flags->auth_token,
                  "Bearer token sent with every call (default: $CENTROIDKV_TOKEN; prefer the "
                  "variable, a flag shows in process listings)")
      ->group("Security");
}

inline void ApplySecurityFlags(const SecurityFlags& flags, ClientOptions* options) {
  options->tls_ca = flags.tls_ca;
  options->tls_cert = flags.tls_cert;
  options->tls_key = flags.tls_key;
  options->tls_server_name = flags.tls_server_name;
  options->auth_token = flags.auth_token;
  if (options->auth_token.empty()) {
    if (const char* token = std::getenv("CENTROIDKV_TOKEN"); token != nullptr) {
      options->auth_token = token;
    }
  }
}

}  // namespace centroidkv::client
