// Shared support of the worker tests (see worker_testing.h).
#include "tests/worker/worker_testing.h"

#include <chrono>

namespace centroidkv::worker::testutil {

std::string ModelPath() { return std::string(CKV_SHARED_DIR) + "/models/stories260K.bin"; }
std::string TokenizerPath() { return std::string(CKV_SHARED_DIR) + "/models/tok512.bin"; }

const Model* Stories260K() {
  static const Model* const model = []() -> const Model* {
    absl::StatusOr<Model> loaded = LoadModel(ModelPath());
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return nullptr;
    }
    return new Model(*std::move(loaded));
  }();
  return model;
}

const Tokenizer* Tok512() {
  static const Tokenizer* const tokenizer = []() -> const Tokenizer* {
    absl::StatusOr<Tokenizer> loaded = LoadTokenizer(TokenizerPath(), 512);
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return nullptr;
    }
    return new Tokenizer(*std::move(loaded));
  }();
  return tokenizer;
}

service::Server* LiveServerTest::server_ = nullptr;
client::Client* LiveServerTest::client_ = nullptr;

void LiveServerTest::SetUpTestSuite() {
  service::ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.worker_threads = 2;
  options.grace_period = std::chrono::milliseconds(500);
  absl::StatusOr<std::unique_ptr<service::Server>> server = service::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = server->release();
  client::ClientOptions client_options;
  client_options.target = server_->target();
  client_options.connect_timeout = std::chrono::seconds(5);
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  client_ = client->release();
}

void LiveServerTest::TearDownTestSuite() {
  delete client_;
  client_ = nullptr;
  delete server_;
  server_ = nullptr;
}

void LiveServerTest::SetUp() {
  ASSERT_NE(server_, nullptr) << "the test server did not start";
  ASSERT_NE(client_, nullptr) << "the client did not connect";
  ASSERT_NE(Stories260K(), nullptr);
}

}  // namespace centroidkv::worker::testutil
