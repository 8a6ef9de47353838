// fp8 golden case loading and comparison (see golden_fp8.h).
#include "tests/testing/golden_fp8.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/status_macros.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"

namespace centroidkv::test {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::vector<float>> Floats(const Json& root, const char* key) {
  const auto found = root.find(key);
  if (found == root.end() || !found->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("case.json: '", key, "' must be a list"));
  }
  std::vector<float> out;
  for (const Json& x : *found) out.push_back(x.get<float>());
  return out;
}

absl::StatusOr<NpyArray> Load(const std::string& dir, const char* file, NpyType type) {
  CKV_ASSIGN_OR_RETURN(NpyArray array, ReadNpy(absl::StrCat(dir, "/", file)));
  if (array.type != type) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", file, ": unexpected dtype ",
                                                   NpyDescr(array.type)));
  }
  return array;
}

template <typename T, typename From = T>
std::vector<T> Elements(const NpyArray& array) {
  const From* data = array.As<From>();
  return std::vector<T>(data, data + array.NumElements());
}

}  // namespace

std::string Fp8GoldenRoot() { return CKV_TEST_DATA_DIR "/golden_fp8"; }

std::vector<std::string> ListFp8GoldenCases() {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(Fp8GoldenRoot(), error)) {
    if (std::filesystem::exists(entry.path() / "case.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<Fp8GoldenCase> LoadFp8GoldenCase(const std::string& name) {
  const std::string dir = absl::StrCat(Fp8GoldenRoot(), "/", name);
  std::ifstream in(dir + "/case.json");
  if (!in) return absl::NotFoundError(absl::StrCat(dir, "/case.json: cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  Fp8GoldenCase golden;
  golden.name = name;
  CKV_ASSIGN_OR_RETURN(golden.options, ParseGoldenConfig(text.str()));
  const Json root = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::optional<DType> dtype =
      ParseKind<DType>(kDTypeNames, root.value("dtype", std::string()));
  const std::optional<DType> output_dtype =
      ParseKind<DType>(kDTypeNames, root.value("output_dtype", std::string()));
  if (!dtype.has_value() || !IsFp8(*dtype) || !output_dtype.has_value() ||
      !IsFp8(*output_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": dtype / output_dtype must be fp8"));
  }
  golden.dtype = *dtype;
  golden.options.result_dtype = *output_dtype;
  CKV_ASSIGN_OR_RETURN(golden.key_scales, Floats(root, "key_scales"));
  CKV_ASSIGN_OR_RETURN(golden.value_scales, Floats(root, "value_scales"));
  CKV_ASSIGN_OR_RETURN(golden.options.result_key_scales, Floats(root, "output_key_scales"));
  CKV_ASSIGN_OR_RETURN(golden.options.result_value_scales, Floats(root, "output_value_scales"));
  CKV_ASSIGN_OR_RETURN(golden.keys, Load(dir, "keys.npy", NpyType::kUInt8));
  CKV_ASSIGN_OR_RETURN(golden.values, Load(dir, "values.npy", NpyType::kUInt8));
  if (golden.keys.shape.size() != 3 || golden.values.shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": keys / values must be [H, n, d]"));
  }
  CompressResult& expected = golden.expected;
  expected.dtype = *output_dtype;
  expected.num_heads = static_cast<int32_t>(golden.keys.shape[0]);
  expected.num_tokens = static_cast<int32_t>(golden.keys.shape[1]);
  expected.key_dim = static_cast<int32_t>(golden.keys.shape[2]);
  expected.value_dim = static_cast<int32_t>(golden.values.shape[2]);
  CKV_ASSIGN_OR_RETURN(NpyArray keys, Load(dir, "out_keys.npy", NpyType::kUInt8));
  CKV_ASSIGN_OR_RETURN(NpyArray values, Load(dir, "out_values.npy", NpyType::kUInt8));
  CKV_ASSIGN_OR_RETURN(NpyArray counts, Load(dir, "out_counts.npy", NpyType::kUInt32));
  CKV_ASSIGN_OR_RETURN(NpyArray offsets, Load(dir, "out_offsets.npy", NpyType::kInt64));
  CKV_ASSIGN_OR_RETURN(NpyArray assignment, Load(dir, "assignment.npy", NpyType::kInt64));
  CKV_ASSIGN_OR_RETURN(NpyArray key_scales, Load(dir, "out_key_scales.npy", NpyType::kFloat32));
  CKV_ASSIGN_OR_RETURN(NpyArray value_scales,
                       Load(dir, "out_value_scales.npy", NpyType::kFloat32));
  expected.fp8_keys = Elements<uint8_t>(keys);
  expected.fp8_values = Elements<uint8_t>(values);
  expected.counts = Elements<uint32_t>(counts);
  expected.offsets = Elements<int64_t>(offsets);
  expected.assignment = Elements<int32_t, int64_t>(assignment);
  expected.key_scales = Elements<float>(key_scales);
  expected.value_scales = Elements<float>(value_scales);
  return golden;
}

LayerView Fp8GoldenLayerView(const Fp8GoldenCase& golden) {
  LayerView view;
  view.dtype = golden.dtype;
  view.num_heads = golden.expected.num_heads;
  view.num_tokens = golden.expected.num_tokens;
  view.key_dim = golden.expected.key_dim;
  view.value_dim = golden.expected.value_dim;
  view.keys = golden.keys.bytes.data();
  view.values = golden.values.bytes.data();
  view.key_scales = golden.key_scales;
  view.value_scales = golden.value_scales;
  return view;
}

void ExpectFp8ResultsEqual(const CompressResult& expected, const CompressResult& actual) {
  EXPECT_EQ(DTypeName(actual.dtype), DTypeName(expected.dtype));
  EXPECT_EQ(actual.offsets, expected.offsets);
  EXPECT_EQ(actual.counts, expected.counts);
  if (!expected.assignment.empty()) {
    EXPECT_EQ(actual.assignment, expected.assignment);
  }
  EXPECT_EQ(actual.key_scales, expected.key_scales);
  EXPECT_EQ(actual.value_scales, expected.value_scales);
  ASSERT_EQ(actual.fp8_keys.size(), expected.fp8_keys.size());
  ASSERT_EQ(actual.fp8_values.size(), expected.fp8_values.size());
  int64_t differing = 0;
  for (size_t i = 0; i < expected.fp8_keys.size(); ++i) {
    differing += actual.fp8_keys[i] != expected.fp8_keys[i];
  }
  for (size_t i = 0; i < expected.fp8_values.size(); ++i) {
    differing += actual.fp8_values[i] != expected.fp8_values[i];
  }
  EXPECT_EQ(differing, 0) << "fp8 codes differ from the expected result";
}

}  // namespace centroidkv::test
