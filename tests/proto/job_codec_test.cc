// Tests of proto/job_codec.cc: what a client writes (StartJobToProto) the server reads back
// as the same job (StartJobFromProto), regular and ragged, with every option; malformed
// StartJobs are refused naming the field; a result header and a JobError survive the round
// trip with the whole account and the error's location; sizes agree on both ends.
#include "centroidkv/wire/job_codec.h"

#include <chrono>
#include <cstdint>
#include <vector>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"
#include "tests/testing/result_checks.h"

namespace centroidkv {
namespace {

CompressOptions EveryOption() {
  CompressOptions options{.target_tokens = 77, .chunk_size = 128, .sink_tokens = 4,
      .recent_tokens = 32, .min_similarity = 0.5, .tighten_per_pass = 0.01, .max_passes = 3,
      .uniform_heads = false, .passthrough_heads = {1, 3}, .compute_assignment = true,
      .exact_target = true, .pad_heads = true, .pad_to = 96,
      .output_layout = TensorLayout::kTokenMajor};
  return options;
}

TEST(JobCodecTest, AStartJobReadsBackAsTheJobTheClientWrote) {
  static const uint32_t kCounts[1] = {1};
  // Only whether counts go along matters to the header.
  const LayerView layer{.dtype = DType::kBFloat16, .layout = TensorLayout::kTokenMajor,
                        .num_heads = 4, .num_tokens = 300, .key_dim = 64, .value_dim = 32,
                        .counts = kCounts};
  const CompressOptions options = EveryOption();
  const v1::StartJob start =
      StartJobToProto(9, 17, layer, options, DType::kFloat16, BackendKind::kReference,
                      std::chrono::milliseconds(1500), -3);
  absl::StatusOr<JobAnnouncement> job = StartJobFromProto(start);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id, 9u);
  EXPECT_EQ(job->layer_index, 17u);
  EXPECT_EQ(job->dtype, DType::kBFloat16);
  EXPECT_EQ(job->layout, TensorLayout::kTokenMajor);
  EXPECT_EQ(job->num_heads, 4);
  EXPECT_EQ(job->num_tokens, 300);
  EXPECT_EQ(job->key_dim, 64);
  EXPECT_EQ(job->value_dim, 32);
  EXPECT_TRUE(job->head_offsets.empty());
  EXPECT_TRUE(job->has_counts);
  EXPECT_EQ(job->output_dtype, DType::kFloat16);
  EXPECT_EQ(job->backend, BackendKind::kReference);
  EXPECT_EQ(job->timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(job->priority, -3);
  test::ExpectOptionsEqual(options, job->options);

  // The view the server assembles into has the client's shape and byte sizes.
  const LayerView view = job->View(nullptr, nullptr, kCounts);
  const InputBytes sent = InputBytesOf(layer), received = InputBytesOf(view);
  EXPECT_EQ(sent.keys, 4u * 300 * 64 * 2);
  EXPECT_EQ(sent.values, 4u * 300 * 32 * 2);
  EXPECT_EQ(sent.counts, 4u * 300 * 4);
  EXPECT_EQ(received.total(), sent.total());
}

TEST(JobCodecTest, ARaggedJobKeepsEveryHeadsLength) {
  const int64_t offsets[] = {0, 5, 5 + 9, 5 + 9 + 1};
  const LayerView layer{.num_heads = 3, .num_tokens = 9, .key_dim = 8, .value_dim = 8,
                        .head_offsets = offsets};
  const v1::StartJob start = StartJobToProto(1, 0, layer, {}, std::nullopt, BackendKind::kAuto,
                                             std::chrono::milliseconds(0), 0);
  ASSERT_EQ(start.head_tokens_size(), 3);
  absl::StatusOr<JobAnnouncement> job = StartJobFromProto(start);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->head_offsets, std::vector<int64_t>(offsets, offsets + 4));
  EXPECT_EQ(job->num_tokens, 9);
  EXPECT_EQ(job->output_dtype, DType::kFloat32) << "unset output dtype = the input's";
  const LayerView view = job->View(nullptr, nullptr, nullptr);
  EXPECT_EQ(view.TotalRows(), 15);
  EXPECT_EQ(view.HeadTokens(2), 1);
  EXPECT_EQ(InputBytesOf(view).total(), InputBytesOf(layer).total());
}

TEST(JobCodecTest, MalformedStartJobsNameTheirField) {
  const LayerView layer{.num_heads = 2, .num_tokens = 8, .key_dim = 4, .value_dim = 4};
  const v1::StartJob good = StartJobToProto(1, 0, layer, {}, std::nullopt, BackendKind::kAuto,
                                            std::chrono::milliseconds(0), 0);
  struct Case {
    const char* field;
    void (*mutate)(v1::StartJob*);
  };
  const Case cases[] = {
      {"start_job.num_heads", [](v1::StartJob* s) { s->set_num_heads(0); }},
      {"start_job.key_dim", [](v1::StartJob* s) { s->set_key_dim(0x80000000u); }},
      {"start_job.dtype", [](v1::StartJob* s) { s->set_dtype(static_cast<v1::DType>(99)); }},
      {"start_job.layout", [](v1::StartJob* s) { s->set_layout(static_cast<v1::Layout>(7)); }},
      {"start_job.backend", [](v1::StartJob* s) { s->set_backend(static_cast<v1::Backend>(42)); }},
      {"start_job.output_layout",
       [](v1::StartJob* s) { s->set_output_layout(static_cast<v1::Layout>(9)); }},
      {"start_job.head_tokens", [](v1::StartJob* s) { s->add_head_tokens(8); }},
      {"start_job.head_tokens",
       [](v1::StartJob* s) {
         s->add_head_tokens(8);
         s->add_head_tokens(0);
       }},
      {"start_job.num_tokens",
       [](v1::StartJob* s) {
         s->add_head_tokens(3);
         s->add_head_tokens(5);
       }},
  };
  for (const Case& c : cases) {
    v1::StartJob start = good;
    c.mutate(&start);
    absl::StatusOr<JobAnnouncement> job = StartJobFromProto(start);
    ASSERT_FALSE(job.ok()) << c.field;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    ASSERT_TRUE(GetFieldLocation(job.status()).has_value()) << job.status();
    EXPECT_EQ(GetFieldLocation(job.status())->field, c.field) << job.status();
  }
}

CompressResult SomeResult() {
  CompressResult result;
  result.num_heads = 2;
  result.num_tokens = 6;
  result.key_dim = 3;
  result.value_dim = 2;
  result.dtype = DType::kFloat16;
  result.offsets = {0, 3, 4};
  result.half_keys.assign(4 * 3, 0x3c00);
  result.half_values.assign(4 * 2, 0x3c00);
  result.counts = {2, 3, 1, 6};
  result.assignment = {0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0};
  result.passes_run = 2;
  result.layout = TensorLayout::kHeadMajor;
  result.target_length = 2;
  result.target_reached = false;
  result.head_tokens = {6, 6};
  result.head_entries = {3, 1};
  result.head_input_tokens = {6, 6};
  result.stop_reasons = {StopReason::kSimilarityFloor, StopReason::kTargetReached};
  return result;
}

TEST(JobCodecTest, AResultHeaderReadsBackWithTheWholeAccount) {
  const CompressResult sent = SomeResult();
  const v1::JobResult header =
      JobResultHeaderToProto(5, 11, sent, DType::kFloat16, {"cpu", 0.25, 1.5});
  EXPECT_EQ(header.job_id(), 5u);
  EXPECT_EQ(header.layer_index(), 11u);
  const ResultBytes bytes = ResultBytesOf(header);
  EXPECT_EQ(bytes.total(), ResultBytesOf(sent, DType::kFloat16).total());
  EXPECT_EQ(bytes.keys, 4u * 3 * 2);
  EXPECT_EQ(bytes.assignment, 12u * 4);
  // float32 rows sent as float32: 4 bytes an element.
  CompressResult floats = sent;
  floats.dtype = DType::kFloat32;
  floats.keys.assign(12, 1.0f);
  floats.values.assign(8, 1.0f);
  EXPECT_EQ(ResultBytesOf(floats, DType::kFloat32).keys, 12u * 4);
  EXPECT_EQ(ResultBytesOf(floats, DType::kBFloat16).values, 8u * 2);

  CompressResult got;
  ResultProvenance provenance;
  ASSERT_TRUE(JobResultHeaderFromProto(header, &got, &provenance).ok());
  EXPECT_EQ(provenance.backend, "cpu");
  EXPECT_EQ(provenance.queue_seconds, 0.25);
  EXPECT_EQ(provenance.compute_seconds, 1.5);
  EXPECT_EQ(got.dtype, DType::kFloat16);
  EXPECT_EQ(got.num_heads, 2);
  EXPECT_EQ(got.num_tokens, 6);
  EXPECT_EQ(got.key_dim, 3);
  EXPECT_EQ(got.value_dim, 2);
  EXPECT_EQ(got.offsets, sent.offsets);
  EXPECT_EQ(got.passes_run, 2);
  EXPECT_EQ(got.target_length, 2);
  EXPECT_FALSE(got.target_reached);
  EXPECT_EQ(got.head_tokens, sent.head_tokens);
  EXPECT_EQ(got.head_entries, sent.head_entries);
  EXPECT_EQ(got.head_input_tokens, sent.head_input_tokens);
  EXPECT_EQ(got.stop_reasons, sent.stop_reasons);
  EXPECT_TRUE(got.counts.empty()) << "the slabs fill the arrays, not the header";

  v1::JobResult unknown_dtype = header;
  unknown_dtype.set_dtype(static_cast<v1::DType>(77));
  EXPECT_EQ(JobResultHeaderFromProto(unknown_dtype, &got, &provenance).code(),
            absl::StatusCode::kDataLoss);
}

TEST(JobCodecTest, MaxResultBytesBoundsEveryResultOfTheShape) {
  const LayerView shape{.num_heads = 2, .num_tokens = 6, .key_dim = 3, .value_dim = 2};
  CompressOptions options;
  options.compute_assignment = true;
  const CompressResult result = SomeResult();
  EXPECT_GE(MaxResultBytes(shape, options, DType::kFloat16),
            ResultBytesOf(result, DType::kFloat16).total());
  EXPECT_EQ(MaxResultBytes(shape, options, DType::kFloat32),
            uint64_t{12} * (3 + 2) * 4 + 12 * 4 + 12 * 4);
  options.pad_to = 10;
  EXPECT_EQ(MaxResultBytes(shape, options, DType::kFloat32),
            uint64_t{20} * (3 + 2) * 4 + 20 * 4 + 12 * 4);
}

TEST(JobCodecTest, AJobErrorKeepsItsCodeAndLocation) {
  const absl::Status status =
      FieldError(absl::StatusCode::kInvalidArgument, {"keys", 3, 17}, "keys: NaN at head 3");
  const v1::JobError error = JobErrorToProto(8, status);
  EXPECT_EQ(error.job_id(), 8u);
  EXPECT_EQ(error.field(), "keys");
  const absl::Status back = StatusFromJobError(error);
  EXPECT_EQ(back.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(back.message(), "keys: NaN at head 3");
  ASSERT_TRUE(GetFieldLocation(back).has_value());
  EXPECT_EQ(GetFieldLocation(back)->field, "keys");
  EXPECT_EQ(GetFieldLocation(back)->head, 3);
  EXPECT_EQ(GetFieldLocation(back)->token, 17);

  // An engine field becomes the wire's name.
  const v1::JobError engine_field =
      JobErrorToProto(1, InvalidFieldError({"passthrough_heads", 9}, "head 9 out of range"));
  EXPECT_EQ(engine_field.field(), "start_job.params.passthrough_heads");
  EXPECT_EQ(engine_field.head(), 9u);

  // A broken peer's codes never read as success or as an out-of-range enum.
  v1::JobError odd = error;
  odd.set_code(0);
  EXPECT_EQ(StatusFromJobError(odd).code(), absl::StatusCode::kUnknown);
  odd.set_code(12345);
  EXPECT_EQ(StatusFromJobError(odd).code(), absl::StatusCode::kUnknown);
  odd.clear_field();
  EXPECT_FALSE(GetFieldLocation(StatusFromJobError(odd)).has_value());
}

// fp8: the input's scales and the static result scales go out with the StartJob and come
// back as the job (the output dtype into options.result_dtype); result scales ride the
// header; result scales with an output that is not fp8 are refused naming the field.
TEST(JobCodecTest, Fp8ScalesTravelBothWays) {
  const std::vector<float> key_scales = {0.5f, 0.25f}, value_scales = {0.125f};
  LayerView layer{.dtype = DType::kFp8E4M3, .num_heads = 2, .num_tokens = 4, .key_dim = 3,
                  .value_dim = 2};
  layer.key_scales = key_scales;
  layer.value_scales = value_scales;
  CompressOptions options;
  options.result_key_scales = {2.0f};
  options.result_value_scales = {3.0f, 4.0f};
  const v1::StartJob start = StartJobToProto(1, 0, layer, options, DType::kFp8E5M2,
                                             BackendKind::kCpu, std::chrono::milliseconds(0), 0);
  EXPECT_EQ(start.dtype(), v1::DTYPE_FP8_E4M3);
  EXPECT_EQ(start.output_dtype(), v1::DTYPE_FP8_E5M2);
  absl::StatusOr<JobAnnouncement> job = StartJobFromProto(start);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->key_scales, key_scales);
  EXPECT_EQ(job->value_scales, value_scales);
  EXPECT_EQ(job->options.result_dtype, DType::kFp8E5M2);
  EXPECT_EQ(job->options.result_key_scales, options.result_key_scales);
  EXPECT_EQ(job->options.result_value_scales, options.result_value_scales);
  const LayerView view = job->View(nullptr, nullptr, nullptr);
  EXPECT_EQ(view.KeyScale(1), 0.25f);
  EXPECT_EQ(view.ValueScale(1), 0.125f);  // one entry: every head
  EXPECT_EQ(InputBytesOf(view).keys, 2u * 4 * 3);  // one byte per element

  v1::StartJob half = start;
  half.set_output_dtype(v1::DTYPE_FLOAT16);
  absl::StatusOr<JobAnnouncement> refused = StartJobFromProto(half);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFieldLocation(refused.status())->field, "start_job.output_key_scales");

  CompressResult result = SomeResult();
  result.dtype = DType::kFp8E4M3;
  result.half_keys.clear();
  result.half_values.clear();
  result.fp8_keys.assign(4 * 3, 0x38);
  result.fp8_values.assign(4 * 2, 0x38);
  result.key_scales = {0.5f, 0.75f};
  result.value_scales = {1.5f, 2.5f};
  const v1::JobResult header =
      JobResultHeaderToProto(5, 0, result, DType::kFp8E4M3, {"cpu", 0.0, 0.0});
  EXPECT_EQ(header.out_keys_bytes(), 12u);
  CompressResult back;
  ResultProvenance provenance;
  ASSERT_TRUE(JobResultHeaderFromProto(header, &back, &provenance).ok());
  EXPECT_EQ(back.dtype, DType::kFp8E4M3);
  EXPECT_EQ(back.key_scales, result.key_scales);
  EXPECT_EQ(back.value_scales, result.value_scales);
}

}  // namespace
}  // namespace centroidkv
