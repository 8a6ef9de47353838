// Shared support of the worker tests: the stories260K model and tokenizer from
// ../shared/models (loaded once), and a fixture with a real in-process CentroidKV server
// on loopback (127.0.0.1:0) per test suite.
// Thread-safety: the accessors load once (function-local statics) and then only read.
#pragma once

#include <memory>
#include <string>

#include "centroidkv/client/client.h"
#include "worker/model.h"
#include "worker/tokenizer.h"
#include "gtest/gtest.h"
#include "service/server.h"

namespace centroidkv::worker::testutil {

std::string ModelPath();      // CKV_SHARED_DIR/models/stories260K.bin
std::string TokenizerPath();  // CKV_SHARED_DIR/models/tok512.bin

// The loaded model and tokenizer; null (with a test failure) when they do not load.
const Model* Stories260K();
const Tokenizer* Tok512();

// A fixture whose suite shares one Server on 127.0.0.1:0 and one Client connected to it.
class LiveServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;

  static service::Server* server_;
  static client::Client* client_;
};

}  // namespace centroidkv::worker::testutil
