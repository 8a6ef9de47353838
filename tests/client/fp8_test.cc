// fp8 KV through the C++ client against a real server on a unix socket: the fp8 golden
// cases (tests/data/golden_fp8) over slabs and over shared memory (the rows written into
// the region in place), on the cpu and reference backends, read back equal to the files;
// KeysAsFloat() widening with the result's scales; and bad scales as JobErrors naming the
// field while the stream's other jobs complete.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "centroidkv/client/client.h"
#include "centroidkv/client/shm_region.h"
#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/client/shm_testing.h"
#include "tests/testing/golden_fp8.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::client {
namespace {

using testutil::UnixServer;

LayerJob Fp8Job(const test::Fp8GoldenCase& golden, BackendKind backend) {
  LayerJob job;
  job.layer = test::Fp8GoldenLayerView(golden);
  job.options = golden.options;
  job.options.compute_assignment = true;
  job.output_dtype = golden.options.result_dtype;
  job.backend = backend;
  return job;
}

// The bytes of a received result's rows: its vectors, or the region it was written to.
std::vector<uint8_t> Bytes(const LayerResult& result, bool keys) {
  if (result.in_region.has_value()) {
    const LayerResult::RegionTensors& region = *result.in_region;
    const uint8_t* data = keys ? region.keys : region.values;
    return std::vector<uint8_t>(data, data + (keys ? region.keys_bytes : region.values_bytes));
  }
  return keys ? result.keys : result.values;
}

void ExpectGolden(const test::Fp8GoldenCase& golden, const LayerResult& result) {
  ASSERT_TRUE(result.status.ok()) << result.status;
  const CompressResult& expected = golden.expected;
  EXPECT_EQ(result.dtype, expected.dtype);
  EXPECT_EQ(Bytes(result, true), expected.fp8_keys);
  EXPECT_EQ(Bytes(result, false), expected.fp8_values);
  EXPECT_EQ(result.key_scales, expected.key_scales);
  EXPECT_EQ(result.value_scales, expected.value_scales);
  EXPECT_EQ(result.offsets, expected.offsets);
  if (result.in_region.has_value()) {
    const uint32_t* counts = result.in_region->counts;
    EXPECT_EQ(std::vector<uint32_t>(counts, counts + result.total_entries()), expected.counts);
    const int32_t* assignment = result.in_region->assignment;
    EXPECT_EQ(std::vector<int32_t>(assignment,
                                   assignment + result.in_region->assignment_elements),
              expected.assignment);
  } else {
    EXPECT_EQ(result.counts, expected.counts);
    EXPECT_EQ(result.assignment, expected.assignment);
  }
}

TEST(Fp8ClientTest, GoldenCasesOverSlabsAndSharedMemory) {
  const std::vector<std::string> names = test::ListFp8GoldenCases();
  ASSERT_FALSE(names.empty()) << "no fp8 golden cases under " << test::Fp8GoldenRoot();
  UnixServer unix_server("fp8");
  ASSERT_NE(unix_server.client, nullptr);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    absl::StatusOr<test::Fp8GoldenCase> golden = test::LoadFp8GoldenCase(name);
    ASSERT_TRUE(golden.ok()) << golden.status();
    for (BackendKind backend : {BackendKind::kCpu, BackendKind::kReference}) {
      SCOPED_TRACE(std::string(BackendKindName(backend)));
      const LayerJob job = Fp8Job(*golden, backend);
      absl::StatusOr<std::vector<LayerResult>> slabs = unix_server.client->CompressLayers({job});
      ASSERT_TRUE(slabs.ok()) << slabs.status();
      ExpectGolden(*golden, (*slabs)[0]);

      absl::StatusOr<std::unique_ptr<ShmLayerStack>> stack = ShmLayerStack::Create(
          unix_server.client.get(), job.layer, 1, job.options, job.output_dtype);
      ASSERT_TRUE(stack.ok()) << stack.status();
      (*stack)->Fill(0, job.layer);
      const service::ServiceMetrics& metrics = unix_server.server->context().metrics;
      const int64_t in_place = metrics.region_results(true);
      LayerJob by_reference = (*stack)->Job(0);
      by_reference.backend = backend;
      absl::StatusOr<std::vector<LayerResult>> shm =
          unix_server.client->CompressLayers({by_reference});
      ASSERT_TRUE(shm.ok()) << shm.status();
      ASSERT_TRUE((*shm)[0].in_region.has_value());
      ExpectGolden(*golden, (*shm)[0]);
      // fp8 rows are quantised above every backend, straight into the region.
      EXPECT_EQ(metrics.region_results(true) - in_place, 1);
    }
  }
}

TEST(Fp8ClientTest, KeysAsFloatWidenWithTheScales) {
  absl::StatusOr<test::Fp8GoldenCase> golden =
      test::LoadFp8GoldenCase(test::ListFp8GoldenCases().front());
  ASSERT_TRUE(golden.ok()) << golden.status();
  UnixServer unix_server("fp8-float");
  ASSERT_NE(unix_server.client, nullptr);
  absl::StatusOr<std::vector<LayerResult>> results =
      unix_server.client->CompressLayers({Fp8Job(*golden, BackendKind::kCpu)});
  ASSERT_TRUE(results.ok()) << results.status();
  const LayerResult& result = (*results)[0];
  const std::vector<float> keys = result.KeysAsFloat();
  ASSERT_EQ(keys.size(), result.keys.size());
  for (int32_t h = 0; h < result.num_heads; ++h) {
    for (int64_t r = result.offsets[h]; r < result.offsets[h + 1]; ++r) {
      for (int32_t j = 0; j < result.key_dim; ++j) {
        const size_t i = static_cast<size_t>(r * result.key_dim + j);
        ASSERT_EQ(keys[i], Fp8ToFloat(result.keys[i], result.dtype) * result.key_scales[h]);
      }
    }
  }
}

TEST(Fp8ClientTest, BadScalesFailTheirJobOnlyNamingTheField) {
  absl::StatusOr<test::Fp8GoldenCase> golden =
      test::LoadFp8GoldenCase(test::ListFp8GoldenCases().front());
  ASSERT_TRUE(golden.ok()) << golden.status();
  UnixServer unix_server("fp8-bad");
  ASSERT_NE(unix_server.client, nullptr);
  const std::vector<float> zero_scale = {0.0f};
  const std::vector<float> three_scales = {0.1f, 0.1f, 0.1f};  // for 4 heads
  const std::vector<float> output_scale = {0.5f};
  std::vector<LayerJob> jobs(4, Fp8Job(*golden, BackendKind::kCpu));
  jobs[0].layer.key_scales = zero_scale;
  jobs[2].layer.value_scales = three_scales;
  const test::RandomLayer floats = test::RandomLayer::Generate(test::Spec(2, 64, 8, 8, 9));
  jobs[3].layer = floats.view();  // fp16 output with result scales
  jobs[3].output_dtype = DType::kFloat16;
  jobs[3].options = CompressOptions{};
  jobs[3].options.result_key_scales = output_scale;
  absl::StatusOr<std::vector<LayerResult>> results = unix_server.client->CompressLayers(jobs);
  ASSERT_TRUE(results.ok()) << results.status();
  const struct {
    absl::StatusCode code;
    const char* field;
  } expected[] = {{absl::StatusCode::kInvalidArgument, "start_job.key_scales"},
                  {absl::StatusCode::kOk, ""},
                  {absl::StatusCode::kInvalidArgument, "start_job.value_scales"},
                  {absl::StatusCode::kInvalidArgument, "start_job.output_key_scales"}};
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(i);
    const LayerResult& result = (*results)[i];
    EXPECT_EQ(result.status.code(), expected[i].code) << result.status;
    if (expected[i].code == absl::StatusCode::kOk) {
      ExpectGolden(*golden, result);
    } else {
      const std::optional<FieldLocation> location = GetFieldLocation(result.status);
      ASSERT_TRUE(location.has_value()) << result.status;
      EXPECT_EQ(location->field, expected[i].field) << result.status;
    }
  }
}

}  // namespace
}  // namespace centroidkv::client
