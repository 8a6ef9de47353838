// Tests of proto/region_codec.cc: spans written by a client read back as the same spans,
// and every check the wire alone can make refuses a bad StartJob naming the field: input
// bytes that do not match the tensor, output spans smaller than the largest result,
// misaligned offsets, counts or assignment spans missing or extra, outputs that overlap
// the input or each other. Spans in different regions never overlap.
#include "centroidkv/wire/region_codec.h"

#include <chrono>
#include <functional>
#include <string>

#include "centroidkv/common/field_status.h"
#include "gtest/gtest.h"

namespace centroidkv {
namespace {

// A 2-head, 16-token float16 layer with dk 8, dv 4: keys 512 bytes, values 256.
LayerView Shape() {
  static const uint32_t kCounts[1] = {1};
  LayerView layer;
  layer.dtype = DType::kFloat16;
  layer.num_heads = 2;
  layer.num_tokens = 16;
  layer.key_dim = 8;
  layer.value_dim = 4;
  layer.counts = kCounts;  // with counts: 128 bytes
  return layer;
}

// A StartJob for Shape() with the assignment, input at 0.. and output at 4096.. of region 7.
v1::StartJob GoodStart() {
  CompressOptions options;
  options.compute_assignment = true;
  v1::StartJob start = StartJobToProto(1, 0, Shape(), options, DType::kFloat32,
                                       BackendKind::kCpu, std::chrono::milliseconds(0), 0);
  RegionInputToProto({{7, 0, 512}, {7, 512, 256}, RegionSpan{7, 768, 128}}, &start);
  const ResultBytes most = MaxResultTensorBytes(Shape(), options, DType::kFloat32);
  RegionOutputToProto({{7, 4096, most.keys},
                       {7, 4096 + most.keys, most.values},
                       {7, 4096 + most.keys + most.values, most.counts},
                       RegionSpan{7, 8192 + most.keys + most.values, most.assignment},
                       std::nullopt},
                      &start);
  return start;
}

absl::StatusOr<JobRegions> Read(const v1::StartJob& start) {
  absl::StatusOr<JobAnnouncement> job = StartJobFromProto(start);
  EXPECT_TRUE(job.ok()) << job.status();
  return JobRegionsFromProto(start, *job);
}

TEST(RegionCodecTest, SpansReadBackAsWritten) {
  absl::StatusOr<JobRegions> regions = Read(GoodStart());
  ASSERT_TRUE(regions.ok()) << regions.status();
  ASSERT_TRUE(regions->input.has_value());
  ASSERT_TRUE(regions->output.has_value());
  EXPECT_EQ(regions->input->values.offset, 512u);
  ASSERT_TRUE(regions->input->counts.has_value());
  EXPECT_EQ(regions->input->counts->bytes, 128u);
  // Float32 output, every entry kept: 2 x 16 rows of 8 floats.
  EXPECT_EQ(regions->output->keys.bytes, 2u * 16 * 8 * 4);
  ASSERT_TRUE(regions->output->assignment.has_value());
  EXPECT_EQ(regions->output->assignment->bytes, 2u * 16 * 4);
}

TEST(RegionCodecTest, NoSpansIsTheSlabPath) {
  v1::StartJob start = GoodStart();
  start.clear_region_input();
  start.clear_region_output();
  absl::StatusOr<JobRegions> regions = Read(start);
  ASSERT_TRUE(regions.ok());
  EXPECT_FALSE(regions->any());
}

TEST(RegionCodecTest, BadSpansAreRefusedNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(v1::StartJob*)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"keys one byte short",
       [](v1::StartJob* s) { s->mutable_region_input()->mutable_keys()->set_bytes(511); },
       "start_job.region_input.keys.bytes"},
      {"values misaligned",
       [](v1::StartJob* s) { s->mutable_region_input()->mutable_values()->set_offset(513); },
       "start_job.region_input.values.offset"},
      {"counts missing",
       [](v1::StartJob* s) { s->mutable_region_input()->clear_counts(); },
       "start_job.region_input.counts"},
      {"out values too small",
       [](v1::StartJob* s) {
         auto* span = s->mutable_region_output()->mutable_out_values();
         span->set_bytes(span->bytes() - 4);
       },
       "start_job.region_output.out_values.bytes"},
      {"assignment missing",
       [](v1::StartJob* s) { s->mutable_region_output()->clear_assignment(); },
       "start_job.region_output.assignment"},
      {"out keys over the input",
       [](v1::StartJob* s) { s->mutable_region_output()->mutable_out_keys()->set_offset(256); },
       "start_job.region_output.out_keys"},
      {"out counts over out values",
       [](v1::StartJob* s) {
         const auto& values = s->region_output().out_values();
         s->mutable_region_output()->mutable_out_counts()->set_offset(values.offset() + 8);
       },
       "start_job.region_output.out_values"},
      {"offset + bytes wraps",
       [](v1::StartJob* s) {
         s->mutable_region_output()->mutable_out_keys()->set_offset(~uint64_t{0} - 7);
       },
       "start_job.region_output.out_keys.offset"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::StartJob start = GoodStart();
    c.edit(&start);
    absl::StatusOr<JobRegions> regions = Read(start);
    ASSERT_FALSE(regions.ok());
    EXPECT_EQ(regions.status().code(), absl::StatusCode::kInvalidArgument);
    std::optional<FieldLocation> location = GetFieldLocation(regions.status());
    ASSERT_TRUE(location.has_value()) << regions.status();
    EXPECT_EQ(location->field, c.field) << regions.status();
  }
}

TEST(RegionCodecTest, SpansInDifferentRegionsDoNotOverlap) {
  v1::StartJob start = GoodStart();
  // The same offsets as the input, but in another region.
  start.mutable_region_output()->mutable_out_keys()->set_region_id(8);
  start.mutable_region_output()->mutable_out_keys()->set_offset(0);
  EXPECT_TRUE(Read(start).ok());
}

}  // namespace
}  // namespace centroidkv
