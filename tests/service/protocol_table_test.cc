// docs/protocol.md's error table, walked row by row. Each row is triggered here against a
// real loopback server, and the status (a JobError for job rows, the stream's status for
// stream rows) must have one of the row's codes and name one of its fields. A row that
// needs what this binary cannot set up (shared memory regions, a GPU, memory pressure, a
// drain, cancellation) names the test that triggers it, which must exist in tests/; a row
// that no test triggers yet is listed with the reason and printed. A row in none of these,
// or an entry left without its row, fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::service::testing {
namespace {

namespace fs = std::filesystem;

const fs::path kRepository = fs::path(CKV_TEST_DATA_DIR) / ".." / "..";

struct Row {
  std::string error;
  std::string scope;               // "job" or "stream"
  std::set<std::string> codes;     // e.g. {"INVALID_ARGUMENT"}
  std::vector<std::string> fields; // the backticked names of the field cell; empty for "-"
};

// The rows of the table headed "| error | scope | code | `field` |".
std::vector<Row> ErrorTable() {
  std::ifstream in(kRepository / "docs" / "protocol.md");
  std::string line;
  std::vector<Row> rows;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("| error | scope | code |", 0) == 0) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("| ---", 0) == 0) continue;
    if (line.empty() || line[0] != '|') break;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    // "" before the first bar and after the last.
    if (cells.size() != 6) {
      ADD_FAILURE() << "a row of the error table without four cells: " << line;
      continue;
    }
    Row row;
    row.error = std::string(absl::StripAsciiWhitespace(cells[1]));
    row.scope = std::string(absl::StripAsciiWhitespace(cells[2]));
    for (absl::string_view code : absl::StrSplit(cells[3], '/')) {
      row.codes.insert(std::string(absl::StripAsciiWhitespace(code)));
    }
    static const std::regex kBackticked("`([^`]+)`");
    for (std::sregex_iterator it(cells[4].begin(), cells[4].end(), kBackticked), end;
         it != end; ++it) {
      row.fields.push_back((*it)[1]);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// What a trigger saw: the status code's name and the field (a JobError's field; for a
// stream's status, the message, which names the field).
struct Seen {
  std::string code;
  std::string field_or_message;
};

std::string CodeName(int32_t code) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                 "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : std::to_string(code);
}

// Whether a field of the row ("start_job.params.NAME" stands for any parameter) is `seen`,
// or (stream rows) is named in the message.
bool NamesAField(const Row& row, const std::string& seen) {
  for (const std::string& field : row.fields) {
    if (field == "-") return true;
    const std::string pattern =
        std::regex_replace(std::regex_replace(field, std::regex(R"(\.)"), R"(\.)"),
                           std::regex("NAME"), "[a-z_]+");
    if (row.scope == "job" ? std::regex_match(seen, std::regex(pattern))
                           : std::regex_search(seen, std::regex(pattern))) {
      return true;
    }
  }
  return false;
}

class ProtocolTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.worker_threads = 1;
    options.incomplete_job_timeout = std::chrono::milliseconds(300);
    server_ = StartLoopbackServer(options);
    ASSERT_NE(server_, nullptr);
    stub_ = MakeStub(server_->target());
  }

  static CompressOptions Small() {
    CompressOptions options;
    options.target_ratio = 0.5;
    options.chunk_size = 16;
    options.sink_tokens = 2;
    options.recent_tokens = 2;
    return options;
  }
  static const test::RandomLayer& Layer() {
    static const test::RandomLayer layer = test::RandomLayer::Generate(test::Spec(2, 64, 8, 8, 5));
    return layer;
  }

  // Sends `requests` on a fresh stream, half-closes it, and returns the first JobError.
  Seen JobError(const std::vector<v1::CompressRequest>& requests) {
    RawStream stream(stub_.get());
    for (const v1::CompressRequest& request : requests) {
      if (!stream.Write(request)) break;
    }
    std::vector<v1::CompressResponse> responses;
    const grpc::Status status = stream.Finish(&responses);
    for (const v1::CompressResponse& response : responses) {
      if (response.has_error()) return {CodeName(response.error().code()), response.error().field()};
    }
    return {"(no JobError; stream " + CodeName(status.error_code()) + ")", status.error_message()};
  }
  // Sends `requests` and returns the stream's final status.
  Seen StreamStatus(const std::vector<v1::CompressRequest>& requests) {
    RawStream stream(stub_.get());
    for (const v1::CompressRequest& request : requests) {
      if (!stream.Write(request)) break;
    }
    const grpc::Status status = stream.Finish();
    return {CodeName(status.error_code()), status.error_message()};
  }

  v1::CompressRequest Start(const std::function<void(v1::StartJob&)>& edit = {},
                            const CompressOptions& options = Small()) {
    v1::CompressRequest request = StartJobRequest(1, Layer().view(), options);
    if (edit) edit(*request.mutable_start_job());
    return request;
  }
  std::vector<v1::CompressRequest> Slabs(const test::RandomLayer& layer, uint64_t job_id = 1) {
    const LayerView view = layer.view();
    return {SlabRequest(job_id, v1::TENSOR_KEYS, 0, view.keys, KeyBytes(view)),
            SlabRequest(job_id, v1::TENSOR_VALUES, 0, view.values, ValueBytes(view))};
  }
  std::vector<v1::CompressRequest> Job(v1::CompressRequest start,
                                       const test::RandomLayer& layer = Layer()) {
    std::vector<v1::CompressRequest> requests{std::move(start)};
    for (v1::CompressRequest& slab : Slabs(layer)) requests.push_back(std::move(slab));
    return requests;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::CentroidKV::Stub> stub_;
};

// The rows' triggers, by a phrase of their error cell, and the rows covered elsewhere, by
// the test that triggers them.
TEST_F(ProtocolTableTest, EveryRowIsTriggeredWithItsCodeAndField) {
  using Trigger = std::function<Seen()>;
  bool has_gpu = false;  // then BACKEND_GPU is served, and its row is left to EngineFactoryTest
  for (const std::string& name : server_->context().engines->EngineNames()) {
    has_gpu = has_gpu || name.rfind("cuda", 0) == 0;
  }
  std::map<std::string, Trigger> triggers = {
      {"unknown `dtype`",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.set_dtype(static_cast<v1::DType>(99)); }))); }},
      {"zero or over-limit `num_heads`",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.set_num_heads(0); }))); }},
      {"`head_tokens`: not one per head",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.add_head_tokens(64); }))); }},
      {"a parameter out of range",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.mutable_params()->set_target_ratio(2.0); }))); }},
      {"`chunk_size` above `limits.max_chunk_size`",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.mutable_params()->set_chunk_size(1 << 20); }))); }},
      {"`passthrough_heads` names a head outside",
       [&] { return JobError(Job(Start([](v1::StartJob& s) { s.mutable_params()->add_passthrough_heads(5); }))); }},
      {"input above `max_job_bytes`",
       [&] {
         return JobError({Start([](v1::StartJob& s) {
           s.set_num_heads(1024);
           s.set_num_tokens(1 << 22);
           s.set_key_dim(4096);
           s.set_value_dim(4096);
         })});
       }},
      {"`slab.data` above `limits.max_slab_bytes`",
       [&] {
         const std::string big(5 << 20, '\0');
         return JobError({Start(), SlabRequest(1, v1::TENSOR_KEYS, 0, big.data(), big.size())});
       }},
      {"a slab for a tensor the job does not have",
       [&] {
         const std::string bytes(64, '\0');
         return JobError({Start(), SlabRequest(1, v1::TENSOR_COUNTS, 0, bytes.data(), bytes.size())});
       }},
      {"a slab past its tensor's end",
       [&] {
         const std::string bytes(KeyBytes(Layer().view()) + 4, '\0');
         return JobError({Start(), SlabRequest(1, v1::TENSOR_KEYS, 0, bytes.data(), bytes.size())});
       }},
      {"NaN / Inf in keys or values",
       [&] {
         test::RandomLayer bad = test::RandomLayer::Generate(test::Spec(2, 64, 8, 8, 5));
         bad.SetKey(1, 3, 2, std::numeric_limits<float>::quiet_NaN());
         return JobError(Job(StartJobRequest(1, bad.view(), Small()), bad));
       }},
      {"`pad_to` below a head's entries",
       [&] {
         CompressOptions options = Small();
         options.pad_heads = true;
         options.pad_to = 4;
         return JobError(Job(Start({}, options)));
       }},
      {"the stream half-closed while the job still expected slabs",
       [&] { return JobError({Start()}); }},
      {"the job's `timeout_ms` passed",
       [&] {
         RawStream stream(stub_.get());
         stream.Write(Start([](v1::StartJob& s) { s.set_timeout_ms(1); }));
         std::this_thread::sleep_for(std::chrono::milliseconds(50));
         for (const v1::CompressRequest& slab : Slabs(Layer())) stream.Write(slab);
         std::vector<v1::CompressResponse> responses;
         stream.Finish(&responses);
         for (const auto& r : responses) {
           if (r.has_error()) return Seen{CodeName(r.error().code()), r.error().field()};
         }
         return Seen{"(no JobError)", ""};
       }},
      {"its slabs did not all arrive within the server's `--incomplete-job-timeout`",
       [&] {
         RawStream stream(stub_.get());
         stream.Write(Start());
         v1::CompressResponse response;
         Seen seen{"(no JobError)", ""};
         if (stream.Read(&response) && response.has_error()) {
           seen = {CodeName(response.error().code()), response.error().field()};
         }
         stream.Finish();
         return seen;
       }},
      {"a result row beyond the range of `output_dtype`",
       [&] {
         test::RandomLayer large = test::RandomLayer::Generate(test::Spec(2, 64, 8, 8, 5));
         for (int32_t t = 0; t < 64; ++t) large.SetKey(0, t, 0, 1e6f);
         v1::CompressRequest start = StartJobRequest(1, large.view(), Small());
         start.mutable_start_job()->set_output_dtype(v1::DTYPE_FLOAT16);
         return JobError(Job(std::move(start), large));
       }},
      {"fp8 scales: missing for an fp8 input",
       [&] {
         return JobError(Job(Start([](v1::StartJob& s) { s.set_dtype(v1::DTYPE_FP8_E4M3); })));
       }},
      {"an empty `CompressRequest`",
       [&] { return StreamStatus({v1::CompressRequest()}); }},
      {"a slab for a job not announced on the stream",
       [&] { return StreamStatus(Slabs(Layer(), 9)); }},
      {"an overlapping slab, or one that leaves a gap",
       [&] {
         const std::string bytes(64, '\0');
         return StreamStatus({Start(), SlabRequest(1, v1::TENSOR_KEYS, 64, bytes.data(), bytes.size())});
       }},
      {"a job id reused while in flight",
       [&] { return StreamStatus({Start(), Start()}); }},
  };
  if (!has_gpu) {
    triggers["`backend: BACKEND_GPU` on a server without one"] = [&] {
      return JobError(Job(Start([](v1::StartJob& s) { s.set_backend(v1::BACKEND_GPU); })));
    };
  }
  // Rows this test cannot set up, and the test that triggers each.
  const std::map<std::string, std::string> elsewhere = {
      {"`uniform_heads` with compressed heads", "TEST(RaggedLayerTest, BadPaddingAndUnequalUniformHeadsNameTheField)"},
      {"a count of 0 before a head's last counted entry", "TEST_P(BadDataTest, ZeroCount)"},
      {"while another job waits for memory", "TEST(StreamWatchdogTest, ReservationsNotEarnedYieldToAWaitingJob)"},
      {"shared memory spans:", "TEST(ShmRegionTest, BadSpansAreJobErrorsNamingTheField)"},
      {"a span past its region's end", "TEST(ShmRegionTest, BadSpansAreJobErrorsNamingTheField)"},
      {"a region this client has not registered", "TEST(ShmRegionTest, BadSpansAreJobErrorsNamingTheField)"},
      {"regions named on a stream that gets no shared memory", "TEST(ShmRegionTest, TcpListenerRefusesRegions)"},
      {"a region's file truncated by its owner", "TEST_F(ShmTruncationTest, InputTruncatedMidJobFailsOnlyThatJob)"},
      {"announced while the server drains", "TEST(ServerTest, GracefulShutdownFinishesJobsInFlightAndRefusesNewOnes)"},
      {"bytes that do not parse", "TEST_F(CompressReactorTest, UnparseableMessageEndsStreamWithInvalidArgument)"},
      {"more than the server's `--max-streams`", "TEST(ServerMemoryTest, ManyUnreadStreamsStayWithinTheBudgetAndExtraOnesAreRefused)"},
      {"nothing read, written or in flight for `--idle-stream-timeout`", "TEST(StreamWatchdogTest, IdleStreamEnds)"},
      {"the client cancelled, the stream's deadline passed", "TEST_F(CompressReactorTest, CancelledBigJobStopsUsingCpuWithinASecond)"},
      {"`backend: BACKEND_GPU` on a server without one", "TEST(EngineFactoryTest, GpuWithoutDeviceIsFailedPrecondition)"},
  };
  // Rows no test triggers yet, with the reason; printed, and listed in ROADMAP.md.
  const std::map<std::string, std::string> untested = {
      {"out of memory, a GPU failure",
       "no test makes an allocation or a GPU fail (the paths are service/compress_reactor.cc's "
       "bad_alloc handlers and kernels/cuda/cuda_status.cc)"},
  };
  std::string sources;
  for (const auto& entry : fs::recursive_directory_iterator(kRepository / "tests")) {
    if (entry.path().extension() != ".cc") continue;
    std::ifstream file(entry.path());
    std::stringstream text;
    text << file.rdbuf();
    sources += text.str();
  }

  const std::vector<Row> rows = ErrorTable();
  ASSERT_GE(rows.size(), 30u) << "the error table was not found in docs/protocol.md";
  std::set<std::string> used;
  for (const Row& row : rows) {
    SCOPED_TRACE(row.error);
    const auto starts = [&row](const std::string& phrase) {
      return row.error.rfind(phrase, 0) == 0;
    };
    auto trigger = std::find_if(triggers.begin(), triggers.end(),
                                [&](const auto& t) { return starts(t.first); });
    if (trigger != triggers.end()) {
      used.insert(trigger->first);
      const Seen seen = trigger->second();
      EXPECT_EQ(row.codes.count(seen.code), 1u) << "got " << seen.code;
      EXPECT_TRUE(NamesAField(row, seen.field_or_message))
          << "got field or message '" << seen.field_or_message << "'";
      continue;
    }
    auto named = std::find_if(elsewhere.begin(), elsewhere.end(),
                              [&](const auto& e) { return starts(e.first); });
    if (named != elsewhere.end()) {
      used.insert(named->first);
      EXPECT_NE(sources.find(named->second), std::string::npos)
          << "the row's test '" << named->second << "' is not in tests/";
      continue;
    }
    auto left = std::find_if(untested.begin(), untested.end(),
                             [&](const auto& u) { return starts(u.first); });
    if (left != untested.end()) {
      used.insert(left->first);
      std::cout << "not triggered by any test: '" << row.error << "': " << left->second << "\n";
      continue;
    }
    ADD_FAILURE() << "a row of docs/protocol.md's error table that no test triggers";
  }
  for (const auto* listed : {&elsewhere, &untested}) {
    for (const auto& [phrase, unused] : *listed) {
      EXPECT_EQ(used.count(phrase), 1u) << "no row of the table starts '" << phrase << "'";
    }
  }
  for (const auto& [phrase, trigger] : triggers) {
    EXPECT_EQ(used.count(phrase), 1u) << "no row of the table starts '" << phrase << "'";
  }
}

}  // namespace
}  // namespace centroidkv::service::testing
