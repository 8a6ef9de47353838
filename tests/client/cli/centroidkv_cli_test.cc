// Tests of the `centroidkv` CLI (client/cli/): the real binary from CKV_BIN_DIR run as a
// child process. Every golden case through `compress --server` (an in-process Server) and
// `compress --local`, its .npy output compared with the golden output; bad input files and
// parameters each exit non-zero with a message on stderr naming the problem. --server also
// takes a replica list.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/kernels/engine_factory.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/client_testing.h"
#include "tests/testing/golden.h"
#include "tests/testing/golden_fp8.h"

namespace centroidkv::cli {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal or not run
  std::string output;
};

// Runs `command` through the shell and returns its exit code and what it wrote to stdout.
CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, read);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

std::string Quoted(const std::string& text) { return "'" + text + "'"; }

std::string Binary() { return std::string(CKV_BIN_DIR) + "/centroidkv"; }

// A double as a flag value that parses back to the same double.
std::string Exact(double value) {
  std::ostringstream out;
  out << std::setprecision(17) << value;
  return out.str();
}

// The flags that give the CLI every parameter of `options` (each one explicit).
std::string ParameterFlags(const CompressOptions& options) {
  std::string flags;
  if (options.target_tokens.has_value()) {
    flags += " --target-tokens " + std::to_string(*options.target_tokens);
  } else {
    flags += " --target-ratio " +
             Exact(options.target_ratio.value_or(CompressOptions::kDefaultTargetRatio));
  }
  flags += " --chunk-size " + std::to_string(options.chunk_size);
  flags += " --sink-tokens " + std::to_string(options.sink_tokens);
  flags += " --recent-tokens " + std::to_string(options.recent_tokens);
  if (options.min_similarity.has_value()) {
    flags += " --min-similarity " + Exact(*options.min_similarity);
  }
  flags += " --tighten-per-pass " + Exact(options.tighten_per_pass);
  flags += " --max-passes " + std::to_string(options.max_passes);
  flags += std::string(" --uniform-heads=") + (options.uniform_heads ? "true" : "false");
  if (!options.passthrough_heads.empty()) {
    std::string heads;
    for (int32_t head : options.passthrough_heads) {
      heads += (heads.empty() ? "" : ",") + std::to_string(head);
    }
    flags += " --passthrough-heads=" + heads;
  }
  return flags;
}

// Reads `dir/name`, checks its element type and rank; null on failure (with a failure).
std::unique_ptr<NpyArray> ReadOutput(const fs::path& dir, const char* name, NpyType type,
                                     size_t rank) {
  absl::StatusOr<NpyArray> array = ReadNpy((dir / name).string());
  EXPECT_TRUE(array.ok()) << array.status();
  if (!array.ok()) return nullptr;
  EXPECT_EQ(NpyDescr(array->type), NpyDescr(type)) << name;
  EXPECT_EQ(array->shape.size(), rank) << name;
  if (array->type != type || array->shape.size() != rank) return nullptr;
  return std::make_unique<NpyArray>(*std::move(array));
}

// The CLI's output folder as a CompressResult, checking the files' types and shapes.
void ReadResult(const fs::path& dir, const test::GoldenCase& golden, CompressResult* result) {
  auto offsets = ReadOutput(dir, "out_offsets.npy", NpyType::kInt64, 1);
  auto keys = ReadOutput(dir, "out_keys.npy", NpyType::kFloat32, 2);
  auto values = ReadOutput(dir, "out_values.npy", NpyType::kFloat32, 2);
  auto counts = ReadOutput(dir, "out_counts.npy", NpyType::kUInt32, 1);
  auto assignment = ReadOutput(dir, "assignment.npy", NpyType::kInt64, 2);
  ASSERT_TRUE(offsets && keys && values && counts && assignment);
  const int64_t total = counts->shape[0];
  EXPECT_EQ(keys->shape, (std::vector<int64_t>{total, golden.key_dim}));
  EXPECT_EQ(values->shape, (std::vector<int64_t>{total, golden.value_dim}));
  EXPECT_EQ(assignment->shape, (std::vector<int64_t>{golden.num_heads, golden.num_tokens}));
  result->num_heads = golden.num_heads;
  result->num_tokens = golden.num_tokens;
  result->key_dim = golden.key_dim;
  result->value_dim = golden.value_dim;
  const int64_t* o = offsets->As<int64_t>();
  result->offsets.assign(o, o + offsets->NumElements());
  const float* k = keys->As<float>();
  result->keys.assign(k, k + keys->NumElements());
  const float* v = values->As<float>();
  result->values.assign(v, v + values->NumElements());
  const uint32_t* c = counts->As<uint32_t>();
  result->counts.assign(c, c + counts->NumElements());
  const int64_t* a = assignment->As<int64_t>();
  for (int64_t i = 0; i < assignment->NumElements(); ++i) {
    result->assignment.push_back(static_cast<int32_t>(a[i]));
  }
}

// Runs `command` (a compress that writes to `out`) and expects exit 0 and the golden case's
// result in `out`; what it printed goes to *output when given.
void ExpectGoldenRun(const std::string& command, const fs::path& out,
                     const test::GoldenCase& golden, std::string* output = nullptr) {
  const CommandResult run = RunCommand(command);
  if (output != nullptr) *output = run.output;
  ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  CompressResult result;
  ASSERT_NO_FATAL_FAILURE(ReadResult(out, golden, &result));
  test::ExpectMatchesGolden(golden, result);
}

class CliTest : public client::testutil::ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    ASSERT_TRUE(fs::exists(Binary())) << Binary() << " is missing (build centroidkv_cli)";
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "-" + info->name();
    for (char& c : name) {
      if (c == '/') c = '-';
    }
    dir_ = fs::temp_directory_path() / ("ckv-cli-test-" + std::to_string(getpid()) + "-" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // " --server TARGET" or " --local".
  static std::string Where(bool local) {
    return local ? std::string(" --local") : " --server " + Quoted(server_->target());
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------
// Golden cases, through a server and in-process.

class CliGoldenTest : public CliTest,
                      public ::testing::WithParamInterface<std::tuple<std::string, bool>> {};

TEST_P(CliGoldenTest, CompressWritesTheGoldenResult) {
  const auto& [name, local] = GetParam();
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(name);
  ASSERT_TRUE(golden.ok()) << golden.status();
  const fs::path out = dir_ / "out";
  const std::string command = Binary() + " compress --in " + Quoted(golden->dir) + " --out " +
                              Quoted(out.string()) + Where(local) +
                              ParameterFlags(golden->options) + " 2>&1";
  std::string output;
  ASSERT_NO_FATAL_FAILURE(ExpectGoldenRun(command, out, *golden, &output));
  EXPECT_NE(output.find("compressed layer"), std::string::npos) << output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CliGoldenTest,
    ::testing::Combine(::testing::ValuesIn(test::ListGoldenCases()), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) {
      return client::testutil::CamelCase(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "Local" : "Server");
    });

// --output-dtype bf16: .npy has no bfloat16, so the rows are written as float32 holding
// exactly the bf16 rounding of the float32 result (the same run with float32 output),
// through a server and in-process.
TEST_F(CliTest, BFloat16OutputIsTheFloatResultRoundedOnce) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase(test::ListGoldenCases().front());
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto compress = [&](bool local, const std::string& dtype, CompressResult* out) {
    const fs::path dir = dir_ / (dtype + (local ? "-local" : "-server"));
    const std::string command = Binary() + " compress --in " + Quoted(golden->dir) + " --out " +
                                Quoted(dir.string()) + Where(local) + " --output-dtype " + dtype +
                                ParameterFlags(golden->options) + " 2>&1";
    const CommandResult run = RunCommand(command);
    ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.output;
    ASSERT_NO_FATAL_FAILURE(ReadResult(dir, *golden, out));
  };
  CompressResult exact;
  ASSERT_NO_FATAL_FAILURE(compress(false, "float32", &exact));
  for (const bool local : {false, true}) {
    SCOPED_TRACE(local ? "local" : "server");
    CompressResult rounded;
    ASSERT_NO_FATAL_FAILURE(compress(local, "bf16", &rounded));
    ASSERT_EQ(rounded.keys.size(), exact.keys.size());
    ASSERT_EQ(rounded.values.size(), exact.values.size());
    for (size_t i = 0; i < exact.keys.size(); ++i) {
      ASSERT_EQ(rounded.keys[i], BFloat16ToFloat(FloatToBFloat16(exact.keys[i]))) << i;
    }
    for (size_t i = 0; i < exact.values.size(); ++i) {
      ASSERT_EQ(rounded.values[i], BFloat16ToFloat(FloatToBFloat16(exact.values[i]))) << i;
    }
    EXPECT_EQ(rounded.counts, exact.counts);
    EXPECT_EQ(rounded.assignment, exact.assignment);
  }
}

// --keys/--values/--counts instead of --in.
TEST_F(CliTest, ExplicitInputPathsWork) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase("counts_in");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const fs::path in(golden->dir);
  const fs::path out = dir_ / "out";
  const std::string command =
      Binary() + " compress --keys " + Quoted((in / "keys.npy").string()) + " --values " +
      Quoted((in / "values.npy").string()) + " --counts " + Quoted((in / "counts.npy").string()) +
      " --out " + Quoted(out.string()) + Where(false) + ParameterFlags(golden->options) + " 2>&1";
  ASSERT_NO_FATAL_FAILURE(ExpectGoldenRun(command, out, *golden));
}

// A result with heads of different lengths (a passthrough head) sent back as it is, through
// --offsets, equals the in-process engine on that ragged layer; --pad-heads pads every head
// to one length with count-0 rows and reports each head.
TEST_F(CliTest, RaggedResultGoesBackThroughOffsetsAndPadHeadsPads) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase("counts_in");
  ASSERT_TRUE(golden.ok()) << golden.status();
  ASSERT_GE(golden->num_heads, 2);
  const fs::path first = dir_ / "first", second = dir_ / "second", padded = dir_ / "padded";
  CompressOptions options = golden->options;
  options.passthrough_heads = {1};
  CommandResult run = RunCommand(Binary() + " compress --in " + Quoted(golden->dir) + " --out " +
                                 Quoted(first.string()) + Where(false) + ParameterFlags(options) +
                                 " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("(passthrough)"), std::string::npos) << run.output;
  auto offsets = ReadOutput(first, "out_offsets.npy", NpyType::kInt64, 1);
  ASSERT_TRUE(offsets);
  const int64_t* o = offsets->As<int64_t>();
  ASSERT_EQ(o[2] - o[1], golden->num_tokens);  // the passthrough head, unchanged
  ASSERT_NE(o[1] - o[0], golden->num_tokens);  // a compressed one: the heads are ragged

  CompressOptions again = options;
  again.target_ratio.reset();
  again.target_tokens = 5;
  const std::string ragged_in =
      " --keys " + Quoted((first / "out_keys.npy").string()) + " --values " +
      Quoted((first / "out_values.npy").string()) + " --counts " +
      Quoted((first / "out_counts.npy").string()) + " --offsets " +
      Quoted((first / "out_offsets.npy").string());
  run = RunCommand(Binary() + " compress" + ragged_in + " --out " + Quoted(second.string()) +
                   Where(false) + ParameterFlags(again) + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // The same ragged layer in process.
  auto keys = ReadOutput(first, "out_keys.npy", NpyType::kFloat32, 2);
  auto values = ReadOutput(first, "out_values.npy", NpyType::kFloat32, 2);
  auto counts = ReadOutput(first, "out_counts.npy", NpyType::kUInt32, 1);
  ASSERT_TRUE(keys && values && counts);
  LayerView view{.num_heads = golden->num_heads, .num_tokens = golden->num_tokens,
      .key_dim = golden->key_dim, .value_dim = golden->value_dim, .keys = keys->As<float>(),
      .values = values->As<float>(), .counts = counts->As<uint32_t>(), .head_offsets = o};
  auto engines = EngineSet::CreateAvailable();
  again.compute_assignment = true;
  auto expected = (*engines->Select(BackendKind::kReference))->Compress(view, again);
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto out_keys = ReadOutput(second, "out_keys.npy", NpyType::kFloat32, 2);
  auto out_counts = ReadOutput(second, "out_counts.npy", NpyType::kUInt32, 1);
  auto assignment = ReadOutput(second, "assignment.npy", NpyType::kInt64, 1);
  ASSERT_TRUE(out_keys && out_counts && assignment);
  EXPECT_EQ(std::vector<float>(out_keys->As<float>(), out_keys->As<float>() + out_keys->NumElements()),
            expected->keys);
  EXPECT_EQ(std::vector<uint32_t>(out_counts->As<uint32_t>(),
                                  out_counts->As<uint32_t>() + out_counts->NumElements()),
            expected->counts);
  EXPECT_EQ(assignment->shape[0], o[golden->num_heads]);  // one per input row

  run = RunCommand(Binary() + " compress --in " + Quoted(golden->dir) + " --out " +
                   Quoted(padded.string()) + Where(false) + ParameterFlags(options) +
                   " --pad-heads 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("padded to " + std::to_string(golden->num_tokens)), std::string::npos)
      << run.output;
  auto padded_offsets = ReadOutput(padded, "out_offsets.npy", NpyType::kInt64, 1);
  auto padded_counts = ReadOutput(padded, "out_counts.npy", NpyType::kUInt32, 1);
  ASSERT_TRUE(padded_offsets && padded_counts);
  for (int64_t h = 0; h <= golden->num_heads; ++h) {
    EXPECT_EQ(padded_offsets->As<int64_t>()[h], h * golden->num_tokens);
  }
  // Head 0's rows past its entries are count-0 padding.
  EXPECT_EQ(padded_counts->As<uint32_t>()[golden->num_tokens - 1], 0u);
}

TEST_F(CliTest, InfoPrintsTheServerVersion) {
  const CommandResult run = RunCommand(Binary() + " info" + Where(false) + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(CKV_TEST_PROJECT_VERSION), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("reference"), std::string::npos) << run.output;
}

// --server with a replica list: the job goes through a ReplicaPool over both servers.
TEST_F(CliTest, CompressOverAReplicaListWritesTheGoldenResult) {
  auto second = service::Server::Start(client::testutil::TestServerOptions("127.0.0.1:0"));
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase("small_basic");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const fs::path out = dir_ / "out";
  const std::string command =
      Binary() + " compress --in " + Quoted(golden->dir) + " --out " + Quoted(out.string()) +
      " --server " + Quoted(server_->target() + "," + (*second)->target()) +
      ParameterFlags(golden->options) + " 2>&1";
  ASSERT_NO_FATAL_FAILURE(ExpectGoldenRun(command, out, *golden));
  const CommandResult info = RunCommand(Binary() + " info --server " +
                                        Quoted(server_->target() + "," + (*second)->target()) +
                                        " 2>&1");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find(CKV_TEST_PROJECT_VERSION), std::string::npos) << info.output;
}

TEST_F(CliTest, MalformedReplicaListIsRejected) {
  const CommandResult run = RunCommand(Binary() + " info --server " +
                                       Quoted(server_->target() + ",,") + " 2>&1");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("target"), std::string::npos) << run.output;
}

// ---------------------------------------------------------------------------------------
// Bad input: a non-zero exit and a message on stderr naming the problem.

class CliBadInputTest : public CliTest, public ::testing::WithParamInterface<bool> {
 protected:
  // Copies small_basic's input into dir_/in, to be spoiled by the test.
  void SetUp() override {
    CliTest::SetUp();
    in_ = dir_ / "in";
    fs::create_directories(in_);
    const fs::path golden = fs::path(test::GoldenRoot()) / "small_basic";
    for (const char* name : {"keys.npy", "values.npy", "counts.npy"}) {
      fs::copy_file(golden / name, in_ / name);
    }
    absl::StatusOr<test::GoldenCase> loaded = test::LoadGoldenCase("small_basic");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    golden_ = *std::move(loaded);
  }

  // Runs compress on dir_/in and expects failure with every `parts` on stderr.
  void ExpectFailure(const std::string& extra_flags, const std::vector<std::string>& parts) {
    const std::string command = Binary() + " compress --in " + Quoted(in_.string()) +
                                " --out " + Quoted((dir_ / "out").string()) + Where(GetParam()) +
                                extra_flags + " 2>&1 >/dev/null";
    const CommandResult run = RunCommand(command);
    EXPECT_NE(run.exit_code, 0) << command;
    EXPECT_NE(run.exit_code, -1) << command << " did not exit normally";
    for (const std::string& part : parts) {
      EXPECT_NE(run.output.find(part), std::string::npos)
          << "stderr does not name '" << part << "': " << run.output;
    }
    EXPECT_FALSE(fs::exists(dir_ / "out" / "out_keys.npy"));
  }

  fs::path in_;
  test::GoldenCase golden_;
};

TEST_P(CliBadInputTest, CorruptKeysFile) {
  std::ofstream(in_ / "keys.npy", std::ios::binary | std::ios::trunc) << "NOTNUMPY, just garbage";
  ExpectFailure("", {"keys.npy", "magic"});
}

TEST_P(CliBadInputTest, IntegerKeys) {
  std::vector<int32_t> data(static_cast<size_t>(golden_.num_heads) * golden_.num_tokens *
                            golden_.key_dim);
  ASSERT_TRUE(WriteNpy((in_ / "keys.npy").string(), NpyType::kInt32,
                       {golden_.num_heads, golden_.num_tokens, golden_.key_dim}, data.data())
                  .ok());
  ExpectFailure("", {"keys.npy", "<i4"});
}

TEST_P(CliBadInputTest, ValuesWithOtherHeadCount) {
  const int64_t heads = golden_.num_heads + 1;
  std::vector<float> data(static_cast<size_t>(heads) * golden_.num_tokens * golden_.value_dim,
                          0.5f);
  ASSERT_TRUE(WriteNpy((in_ / "values.npy").string(), NpyType::kFloat32,
                       {heads, golden_.num_tokens, golden_.value_dim}, data.data())
                  .ok());
  ExpectFailure("", {"values.npy", "heads"});
}

TEST_P(CliBadInputTest, ValuesWithOtherTokenCount) {
  const int64_t tokens = golden_.num_tokens - 1;
  std::vector<float> data(static_cast<size_t>(golden_.num_heads) * tokens * golden_.value_dim,
                          0.5f);
  ASSERT_TRUE(WriteNpy((in_ / "values.npy").string(), NpyType::kFloat32,
                       {golden_.num_heads, tokens, golden_.value_dim}, data.data())
                  .ok());
  ExpectFailure("", {"values.npy", "tokens"});
}

TEST_P(CliBadInputTest, ZeroCount) {
  std::vector<uint32_t> counts(static_cast<size_t>(golden_.num_heads) * golden_.num_tokens, 1);
  counts[golden_.num_tokens + 7] = 0;
  ASSERT_TRUE(WriteNpy((in_ / "counts.npy").string(), NpyType::kUInt32,
                       {golden_.num_heads, golden_.num_tokens}, counts.data())
                  .ok());
  ExpectFailure(" --chunk-size 8", {"INVALID_ARGUMENT", "counts"});
}

// Both targets at once: a usage error from the flag parser, exit 2 as for other bad input.
TEST_P(CliBadInputTest, BothTargets) {
  ExpectFailure(" --target-ratio 0.5 --target-tokens 3", {"--target-ratio", "--target-tokens"});
  const CommandResult run = RunCommand(Binary() + " compress --local --in " +
                                       Quoted(in_.string()) +
                                       " --target-ratio 0.5 --target-tokens 3 2>/dev/null");
  EXPECT_EQ(run.exit_code, 2);
}

TEST_P(CliBadInputTest, ChunkSizeOne) {
  ExpectFailure(" --chunk-size 1", {"INVALID_ARGUMENT", "chunk_size"});
}

INSTANTIATE_TEST_SUITE_P(Modes, CliBadInputTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Local" : "Server";
                         });

// --shm: the layer goes by reference to shared memory over a unix socket and the result
// read back from the region is the golden one; on TCP it fails saying why.
TEST_F(CliTest, ShmOverAUnixSocketWritesTheGoldenResult) {
  absl::StatusOr<test::GoldenCase> golden = test::LoadGoldenCase("small_basic");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::string socket = (dir_ / "ckv.sock").string();
  auto unix_server =
      service::Server::Start(client::testutil::TestServerOptions("unix://" + socket));
  ASSERT_TRUE(unix_server.ok()) << unix_server.status();
  const fs::path out = dir_ / "out";
  const std::string command = Binary() + " compress --shm --in " + Quoted(golden->dir) +
                              " --out " + Quoted(out.string()) + " --server " +
                              Quoted((*unix_server)->target()) +
                              ParameterFlags(golden->options) + " 2>&1";
  ASSERT_NO_FATAL_FAILURE(ExpectGoldenRun(command, out, *golden));
  EXPECT_EQ((*unix_server)->context().regions.regions(), 0u);  // unregistered on exit

  const CommandResult tcp = RunCommand(Binary() + " compress --shm --in " +
                                       Quoted(golden->dir) + " --out " +
                                       Quoted((dir_ / "tcp").string()) + Where(false) + " 2>&1");
  EXPECT_NE(tcp.exit_code, 0) << tcp.output;
  EXPECT_NE(tcp.output.find("unix socket"), std::string::npos) << tcp.output;
}

// fp8: --input-dtype with uint8 code files and their scales, --output-dtype fp8 with static
// or dynamic result scales; the out files (uint8 codes, out_*_scales.npy) are the fp8
// golden case's, through a server, in-process and over shared memory.
std::string ScaleList(const std::vector<float>& scales) {
  std::string list;
  for (float scale : scales) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(scale));  // round-trips
    list += (list.empty() ? "" : ",") + std::string(text);
  }
  return list;
}

std::vector<uint8_t> ArrayBytes(const fs::path& dir, const char* name) {
  absl::StatusOr<NpyArray> array = ReadNpy((dir / name).string());
  EXPECT_TRUE(array.ok()) << array.status();
  return array.ok() ? array->bytes : std::vector<uint8_t>{};
}

std::vector<uint8_t> AsBytes(const void* data, size_t bytes) {
  const auto* begin = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(begin, begin + bytes);
}

TEST_F(CliTest, Fp8GoldenCasesThroughServerLocalAndShm) {
  const std::string socket = (dir_ / "ckv.sock").string();
  auto unix_server =
      service::Server::Start(client::testutil::TestServerOptions("unix://" + socket));
  ASSERT_TRUE(unix_server.ok()) << unix_server.status();
  for (const std::string& name : test::ListFp8GoldenCases()) {
    absl::StatusOr<test::Fp8GoldenCase> golden = test::LoadFp8GoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    const std::string in = test::Fp8GoldenRoot() + "/" + name;
    const CompressOptions& options = golden->options;
    std::string flags = " --keys " + Quoted(in + "/keys.npy") + " --values " +
                        Quoted(in + "/values.npy") + " --input-dtype " +
                        std::string(DTypeName(golden->dtype)) + " --key-scales " +
                        ScaleList(golden->key_scales) + " --value-scales " +
                        ScaleList(golden->value_scales) + " --output-dtype " +
                        std::string(DTypeName(options.result_dtype)) +
                        ParameterFlags(options);
    if (!options.result_key_scales.empty()) {
      flags += " --output-key-scales " + ScaleList(options.result_key_scales) +
               " --output-value-scales " + ScaleList(options.result_value_scales);
    }
    const std::string wheres[] = {Where(false), Where(true),
                                  " --shm --server " + Quoted((*unix_server)->target())};
    for (const std::string& where : wheres) {
      SCOPED_TRACE(name + where);
      const fs::path out = dir_ / "out";
      fs::remove_all(out);
      const CommandResult run =
          RunCommand(Binary() + " compress --quiet --out " + Quoted(out.string()) + flags +
                     where + " 2>&1");
      ASSERT_EQ(run.exit_code, 0) << run.output;
      const CompressResult& expected = golden->expected;
      EXPECT_EQ(ArrayBytes(out, "out_keys.npy"), expected.fp8_keys);
      EXPECT_EQ(ArrayBytes(out, "out_values.npy"), expected.fp8_values);
      EXPECT_EQ(ArrayBytes(out, "out_key_scales.npy"),
                AsBytes(expected.key_scales.data(), expected.key_scales.size() * 4));
      EXPECT_EQ(ArrayBytes(out, "out_value_scales.npy"),
                AsBytes(expected.value_scales.data(), expected.value_scales.size() * 4));
      EXPECT_EQ(ArrayBytes(out, "out_counts.npy"),
                AsBytes(expected.counts.data(), expected.counts.size() * 4));
    }
  }
  // uint8 files without --input-dtype are refused, naming what is missing.
  const std::string in = test::Fp8GoldenRoot() + "/" + test::ListFp8GoldenCases().front();
  const CommandResult bare = RunCommand(Binary() + " compress --local --keys " +
                                        Quoted(in + "/keys.npy") + " --values " +
                                        Quoted(in + "/values.npy") + " 2>&1");
  EXPECT_EQ(bare.exit_code, 2) << bare.output;
  EXPECT_NE(bare.output.find("--input-dtype"), std::string::npos) << bare.output;
}

}  // namespace
}  // namespace centroidkv::cli
