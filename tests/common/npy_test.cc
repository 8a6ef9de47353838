// Tests of common/npy.cc: write/read round trips for every element type, hand-built images
// as numpy writes them, every golden .npy file, and clear errors for malformed files.
#include "centroidkv/common/npy.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv {

// Readable test parameters in failure messages (found by ADL in NpyType's namespace).
static void PrintTo(NpyType type, std::ostream* os) { *os << NpyDescr(type); }

namespace {

// A .npy image: magic, version `major`.0, header length (2 bytes for 1.0, 4 for 2.0/3.0),
// the header dict padded with spaces and a newline to a multiple of 64, then `data`.
std::vector<uint8_t> NpyImage(int major, std::string dict, const std::vector<uint8_t>& data) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = 6 + 2 + length_bytes;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict.push_back('\n');
  std::vector<uint8_t> image = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (size_t i = 0; i < length_bytes; ++i) {
    image.push_back(static_cast<uint8_t>((dict.size() >> (8 * i)) & 0xffu));
  }
  image.insert(image.end(), dict.begin(), dict.end());
  image.insert(image.end(), data.begin(), data.end());
  return image;
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// EXPECTs an error of `code` whose message contains every one of `needles`.
void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& needles) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& needle : needles) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, std::string(status.message()));
  }
}

// A fresh directory under the GoogleTest temp dir, removed at the end of the test.
class NpyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string leaf = std::string("ckv_npy_") + info->test_suite_name() + "_" + info->name();
    for (char& c : leaf) {
      if (c == '/') c = '_';
    }
    dir_ = (std::filesystem::path(::testing::TempDir()) / leaf).string();
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(std::filesystem::create_directories(dir_)) << dir_;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& file) const { return dir_ + "/" + file; }

 private:
  std::string dir_;
};

class NpyRoundTripTest : public NpyFileTest, public ::testing::WithParamInterface<NpyType> {};

TEST_P(NpyRoundTripTest, WriteThenReadGivesTheSameArray) {
  const NpyType type = GetParam();
  const std::vector<std::vector<int64_t>> shapes = {{7}, {2, 3, 5}, {4, 1}, {0, 3}};
  for (const std::vector<int64_t>& shape : shapes) {
    int64_t elements = 1;
    for (int64_t dim : shape) elements *= dim;
    std::vector<uint8_t> data(static_cast<size_t>(elements * NpyTypeSize(type)));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);
    const std::string path = Path("array.npy");
    ASSERT_TRUE(WriteNpy(path, type, shape, data.data()).ok());

    absl::StatusOr<NpyArray> array = ReadNpy(path);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->type, type);
    EXPECT_EQ(array->shape, shape);
    EXPECT_EQ(array->NumElements(), elements);
    EXPECT_EQ(array->bytes, data);

    // numpy requires the data to start at a multiple of 64 bytes.
    const auto file_size = static_cast<int64_t>(std::filesystem::file_size(path));
    EXPECT_EQ((file_size - static_cast<int64_t>(data.size())) % 64, 0);
  }
}

std::string NpyTypeTestName(const ::testing::TestParamInfo<NpyType>& info) {
  const char* names[] = {"Float32", "Float16", "UInt32", "Int32", "Int64", "UInt64"};
  return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllTypes, NpyRoundTripTest,
                         ::testing::Values(NpyType::kFloat32, NpyType::kFloat16, NpyType::kUInt32,
                                           NpyType::kInt32, NpyType::kInt64, NpyType::kUInt64),
                         NpyTypeTestName);

TEST(NpyTest, DescrsAndSizes) {
  EXPECT_EQ(NpyDescr(NpyType::kFloat32), "<f4");
  EXPECT_EQ(NpyDescr(NpyType::kFloat16), "<f2");
  EXPECT_EQ(NpyDescr(NpyType::kUInt32), "<u4");
  EXPECT_EQ(NpyDescr(NpyType::kInt32), "<i4");
  EXPECT_EQ(NpyDescr(NpyType::kInt64), "<i8");
  EXPECT_EQ(NpyDescr(NpyType::kUInt64), "<u8");
  EXPECT_EQ(NpyTypeSize(NpyType::kFloat16), 2);
  EXPECT_EQ(NpyTypeSize(NpyType::kUInt32), 4);
  EXPECT_EQ(NpyTypeSize(NpyType::kUInt64), 8);
}

TEST(NpyTest, ParsesHeaderAsNumpyWritesIt) {
  const std::vector<float> values = {1.0f, -2.5f, 3.0f, 0.25f, 8.0f, -0.0f};
  const std::vector<uint8_t> image = NpyImage(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", FloatBytes(values));
  absl::StatusOr<NpyArray> array = ParseNpy("image", image);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->type, NpyType::kFloat32);
  EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(array->NumElements(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(array->As<float>()[i], values[i]) << i;
}

TEST(NpyTest, ParsesVersionTwoAndThreeHeaders) {
  for (int major : {2, 3}) {
    const std::vector<uint8_t> image =
        NpyImage(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                 FloatBytes({1.0f, 2.0f, 3.0f}));
    absl::StatusOr<NpyArray> array = ParseNpy("image", image);
    ASSERT_TRUE(array.ok()) << "version " << major << ": " << array.status();
    EXPECT_EQ(array->shape, (std::vector<int64_t>{3}));
    EXPECT_EQ(array->As<float>()[2], 3.0f);
  }
}

TEST(NpyTest, ParsesScalarShape) {
  const std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", FloatBytes({7.0f}));
  absl::StatusOr<NpyArray> array = ParseNpy("scalar", image);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->shape.empty());
  EXPECT_EQ(array->NumElements(), 1);
  EXPECT_EQ(array->As<float>()[0], 7.0f);
}

TEST(NpyTest, ReadsEveryGoldenFile) {
  const std::filesystem::path root = std::filesystem::path(CKV_SHARED_DIR) / "golden";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".npy") continue;
    ++files;
    absl::StatusOr<NpyArray> array = ReadNpy(entry.path().string());
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_FALSE(array->shape.empty()) << entry.path();
    EXPECT_EQ(static_cast<int64_t>(array->bytes.size()),
              array->NumElements() * NpyTypeSize(array->type))
        << entry.path();
    const std::string stem = entry.path().stem().string();
    if (stem == "counts" || stem == "out_counts") {
      EXPECT_EQ(array->type, NpyType::kUInt32);
    }
    if (stem == "assignment" || stem == "out_offsets") {
      EXPECT_EQ(array->type, NpyType::kInt64);
    }
    if (stem == "out_keys" || stem == "out_values") {
      EXPECT_EQ(array->type, NpyType::kFloat32);
    }
  }
  EXPECT_GE(files, 7 * 8) << "expected the 7 golden cases of 8 .npy files each under " << root;
}

TEST(NpyTest, RejectsBadMagic) {
  std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", FloatBytes({1}));
  image[1] = 'X';
  ExpectError(ParseNpy("bad.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"bad.npy", "magic"});
  ExpectError(ParseNpy("tiny.npy", {0x93, 'N'}).status(), absl::StatusCode::kInvalidArgument,
              {"tiny.npy", "magic"});
}

TEST(NpyTest, RejectsBigEndianDescr) {
  const std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", FloatBytes({1}));
  ExpectError(ParseNpy("be.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"be.npy", ">f4"});
}

TEST(NpyTest, RejectsUnsupportedDescr) {
  const std::vector<uint8_t> image = NpyImage(
      1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", std::vector<uint8_t>(8));
  ExpectError(ParseNpy("f8.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"f8.npy", "<f8"});
}

TEST(NpyTest, RejectsFortranOrder) {
  const std::vector<uint8_t> image = NpyImage(
      1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", FloatBytes({1, 2, 3, 4}));
  ExpectError(ParseNpy("fortran.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"fortran.npy", "Fortran"});
}

TEST(NpyTest, RejectsTruncatedData) {
  std::vector<uint8_t> image = NpyImage(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", FloatBytes({1, 2, 3, 4}));
  image.pop_back();
  ExpectError(ParseNpy("short.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"short.npy", "15 bytes", "16"});
}

TEST(NpyTest, RejectsTrailingData) {
  std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", FloatBytes({1, 2}));
  ExpectError(ParseNpy("long.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"long.npy", "8 bytes"});
}

TEST(NpyTest, RejectsTruncatedHeader) {
  std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", {});
  image.resize(30);
  ExpectError(ParseNpy("cut.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"cut.npy", "truncated"});
}

TEST(NpyTest, RejectsUnknownVersion) {
  const std::vector<uint8_t> image =
      NpyImage(4, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", FloatBytes({1}));
  ExpectError(ParseNpy("v4.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"v4.npy", "version 4"});
}

TEST(NpyTest, RejectsBadShape) {
  const std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", {});
  ExpectError(ParseNpy("shape.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"shape.npy", "shape"});
}

// Found by fuzz/npy_fuzzer.cc: products that wrap around 2^64 (to 0 here, matching the empty
// data) were signed overflow and could accept a shape far larger than the data.
TEST(NpyTest, RejectsShapeWhoseSizeOverflows) {
  for (const char* shape : {"(4294967296, 4294967296, 4)", "(4611686018427387904, 4)",
                            "(9223372036854775807, 2)"}) {
    const std::vector<uint8_t> image = NpyImage(
        1, std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape + ", }",
        {});
    ExpectError(ParseNpy("huge.npy", image).status(), absl::StatusCode::kInvalidArgument,
                {"huge.npy", "too large"});
  }
}

TEST(NpyTest, RejectsMissingHeaderEntry) {
  const std::vector<uint8_t> image =
      NpyImage(1, "{'descr': '<f4', 'shape': (1,), }", FloatBytes({1}));
  ExpectError(ParseNpy("nofortran.npy", image).status(), absl::StatusCode::kInvalidArgument,
              {"nofortran.npy", "fortran_order"});
}

TEST_F(NpyFileTest, MissingFileIsNotFound) {
  ExpectError(ReadNpy(Path("absent.npy")).status(), absl::StatusCode::kNotFound, {"absent.npy"});
}

TEST_F(NpyFileTest, WriteIntoMissingFolderFails) {
  const float value = 1.0f;
  const absl::Status status = WriteNpy(Path("no/such/dir/x.npy"), NpyType::kFloat32, {1}, &value);
  EXPECT_FALSE(status.ok());
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "x.npy", std::string(status.message()));
}

TEST_F(NpyFileTest, ReadsWhatWasWrittenByHand) {
  const std::vector<uint8_t> image = NpyImage(
      1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
      std::vector<uint8_t>{5, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
  const std::string path = Path("hand.npy");
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(image.data()),
             static_cast<std::streamsize>(image.size()));
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->type, NpyType::kInt64);
  EXPECT_EQ(array->As<int64_t>()[0], 5);
  EXPECT_EQ(array->As<int64_t>()[1], -1);
}

}  // namespace
}  // namespace centroidkv
