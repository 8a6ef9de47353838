// Shared support of the client tests (see client_testing.h).
#include "tests/client/client_testing.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>

#include "centroidkv/kernels/engine_factory.h"

namespace centroidkv::client::testutil {
namespace {

// `values` rounded once to `dtype`, as bytes: what the server must send.
std::vector<uint8_t> Rounded(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(bytes.data(), dtype, static_cast<int64_t>(i), values[i]);
  }
  return bytes;
}

// EXPECTs equal byte images of `what`, reporting the first differing element.
void ExpectSameElements(const char* what, const std::vector<uint8_t>& expected,
                        const std::vector<uint8_t>& actual, int32_t element_size) {
  ASSERT_EQ(actual.size(), expected.size()) << what << " bytes";
  for (size_t i = 0; i < expected.size(); i += element_size) {
    if (std::memcmp(&expected[i], &actual[i], element_size) != 0) {
      ADD_FAILURE() << what << ": element " << i / element_size << " of "
                    << expected.size() / element_size << " differs";
      return;
    }
  }
}

test::RandomLayerSpec VariedSpec(int i, uint64_t seed_base) {
  static constexpr int32_t kTokens[] = {1, 2, 17, 64, 100, 129, 257, 300};
  static constexpr int32_t kDims[] = {4, 8, 16, 32, 64};
  static constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  test::RandomLayerSpec spec;
  spec.num_heads = 1 + i % 4;
  spec.num_tokens = kTokens[i % 8];
  spec.key_dim = kDims[i % 5];
  spec.value_dim = kDims[(i / 2) % 5];
  spec.dtype = kDTypes[i % 3];
  spec.layout = i % 7 < 3 ? TensorLayout::kTokenMajor : TensorLayout::kHeadMajor;
  spec.with_counts = i % 3 == 1;
  spec.prototypes = i % 2 == 0 ? 3 + i % 5 : 0;
  spec.noise = 0.1;
  spec.seed = seed_base + static_cast<uint64_t>(i);
  return spec;
}

CompressOptions VariedOptions(int i, int32_t num_heads) {
  static constexpr int32_t kChunks[] = {2, 3, 8, 16, 33, 64, 256};
  CompressOptions options;
  if (i % 5 == 2) {
    options.target_tokens = 1 + i;
  } else {
    options.target_ratio = 0.1 + 0.1 * (i % 8);
  }
  options.chunk_size = kChunks[i % 7];
  options.sink_tokens = i % 4;
  options.recent_tokens = (i * 3) % 11;
  if (i % 4 == 3) {
    options.min_similarity = 0.2;
    options.tighten_per_pass = 0.05;
  }
  options.max_passes = 1 + i % 8;
  options.uniform_heads = i % 6 != 5;
  if (num_heads > 1 && i % 3 == 0) options.passthrough_heads = {num_heads - 1};
  options.compute_assignment = i % 9 != 4;
  return options;
}

}  // namespace

service::ServerOptions TestServerOptions(const std::string& listen_address) {
  service::ServerOptions options;
  options.listen_address = listen_address;
  options.worker_threads = 2;
  options.max_job_bytes = kTestMaxJobBytes;
  options.max_stream_bytes = kTestMaxStreamBytes;
  options.grace_period = std::chrono::milliseconds(500);
  return options;
}

const ClusterEngine& ReferenceEngine() {
  static const EngineSet* const engines = EngineSet::CreateAvailable().release();
  return **engines->Select(BackendKind::kReference);
}

LayerJob GoldenJob(const test::GoldenCase& golden) {
  LayerJob job;
  job.layer = test::GoldenLayerView(golden);
  job.options = golden.options;
  job.options.compute_assignment = true;
  job.output_dtype = DType::kFloat32;
  job.backend = BackendKind::kCpu;
  return job;
}

CompressResult EngineResult(const LayerJob& job) {
  absl::StatusOr<CompressResult> result = ReferenceEngine().Compress(job.layer, job.options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : CompressResult{};
}

CompressResult AsEngineResult(const LayerResult& result) {
  CompressResult out;
  out.num_heads = result.num_heads;
  out.num_tokens = result.num_tokens;
  out.key_dim = result.key_dim;
  out.value_dim = result.value_dim;
  out.offsets = result.offsets;
  out.keys = result.KeysAsFloat();
  out.values = result.ValuesAsFloat();
  out.counts = result.counts;
  out.assignment = result.assignment;
  out.passes_run = result.passes_run;
  out.head_budgets = result.head_budgets;
  out.head_exact_entries = result.head_exact_entries;
  out.log_weights = result.log_weights;
  return out;
}

void ExpectSameAsEngine(const CompressResult& expected, DType dtype, const LayerResult& actual) {
  ASSERT_TRUE(actual.status.ok()) << actual.status;
  EXPECT_EQ(actual.dtype, dtype);
  EXPECT_EQ(actual.num_heads, expected.num_heads);
  EXPECT_EQ(actual.num_tokens, expected.num_tokens);
  EXPECT_EQ(actual.key_dim, expected.key_dim);
  EXPECT_EQ(actual.value_dim, expected.value_dim);
  EXPECT_EQ(actual.offsets, expected.offsets);
  EXPECT_EQ(actual.counts, expected.counts);
  EXPECT_EQ(actual.assignment, expected.assignment);
  EXPECT_EQ(actual.passes_run, expected.passes_run);
  ExpectSameElements("keys", Rounded(expected.keys, dtype), actual.keys, DTypeSize(dtype));
  ExpectSameElements("values", Rounded(expected.values, dtype), actual.values,
                     DTypeSize(dtype));
}

std::string CamelCase(const std::string& name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out.push_back(upper && c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c);
    upper = false;
  }
  return out;
}

JobSet MakeVariedJobs(int count, uint64_t seed_base, uint32_t first_layer_index) {
  JobSet set;
  for (int i = 0; i < count; ++i) {
    set.specs.push_back(VariedSpec(i, seed_base));
    set.layers.push_back(test::RandomLayer::Generate(set.specs.back()));
  }
  for (int i = 0; i < count; ++i) {  // views only once the vector stops moving
    LayerJob job;
    job.layer_index = first_layer_index + static_cast<uint32_t>(i);
    job.layer = set.layers[i].view();
    job.options = VariedOptions(i, set.specs[i].num_heads);
    if (i % 4 != 0) job.output_dtype = DType::kFloat32;
    job.backend = BackendKind::kReference;
    set.jobs.push_back(job);
  }
  return set;
}

void RunPipelined(CompressStream* stream, const std::vector<LayerJob>& jobs,
                  const std::vector<test::RandomLayerSpec>& specs,
                  const std::function<void(size_t)>& after_result) {
  std::map<uint64_t, size_t> index_of;
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<uint64_t> id = stream->Submit(jobs[i]);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(index_of.emplace(*id, i).second) << "job id " << *id << " given twice";
  }
  std::vector<bool> seen(jobs.size(), false);
  for (size_t received = 0; received < jobs.size(); ++received) {
    absl::StatusOr<LayerResult> result = stream->Next();
    ASSERT_TRUE(result.ok()) << result.status();
    auto it = index_of.find(result->job_id);
    ASSERT_NE(it, index_of.end()) << "result for unknown job id " << result->job_id;
    const size_t i = it->second;
    SCOPED_TRACE(specs[i].ToString());
    EXPECT_FALSE(seen[i]) << "two results for job " << i;
    seen[i] = true;
    EXPECT_EQ(result->layer_index, jobs[i].layer_index);
    EXPECT_EQ(result->backend, "reference");
    ExpectSameAsEngine(EngineResult(jobs[i]), jobs[i].output_dtype.value_or(jobs[i].layer.dtype),
                       *result);
    if (after_result) after_result(received + 1);
  }
  absl::StatusOr<LayerResult> extra = stream->Next();
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kOutOfRange) << extra.status();
  EXPECT_TRUE(stream->Close().ok());
}

int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

service::Server* ServerTest::server_ = nullptr;

void ServerTest::SetUpTestSuite() {
  auto server = service::Server::Start(TestServerOptions("127.0.0.1:0"));
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = server->release();
}

void ServerTest::TearDownTestSuite() {
  delete server_;
  server_ = nullptr;
}

void ServerTest::SetUp() { ASSERT_NE(server_, nullptr) << "the test server did not start"; }

ClientOptions ServerTest::Options() {
  ClientOptions options;
  options.target = server_->target();
  options.connect_timeout = std::chrono::seconds(5);
  return options;
}

std::unique_ptr<Client> ServerTest::Connect(const ClientOptions& options) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

}  // namespace centroidkv::client::testutil
