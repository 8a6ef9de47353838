// Golden case loading and result comparison (see golden.h).
#include "tests/testing/golden.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace centroidkv::test {
namespace {

using Json = nlohmann::json;

// Mismatches reported one by one per field before only counting the rest.
constexpr int kMaxReportedMismatches = 5;

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status ConfigError(const std::string& key, const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("case.json config: '", key, "' must be ", expected));
}

// Applies one "config" entry to `options`.
absl::Status ApplyConfigEntry(const std::string& key, const Json& value, CompressOptions* options) {
  const bool is_int = value.is_number_integer();
  if (key == "target_ratio" || key == "min_similarity" || key == "tighten_per_pass") {
    if (!value.is_number()) return ConfigError(key, "a number");
    const double number = value.get<double>();
    if (key == "target_ratio") options->target_ratio = number;
    if (key == "min_similarity") options->min_similarity = number;
    if (key == "tighten_per_pass") options->tighten_per_pass = number;
  } else if (key == "target_tokens") {
    if (!is_int) return ConfigError(key, "an integer");
    options->target_tokens = value.get<int64_t>();
  } else if (key == "chunk_size" || key == "sink_tokens" || key == "recent_tokens" ||
             key == "max_passes") {
    if (!is_int) return ConfigError(key, "an integer");
    const int32_t number = value.get<int32_t>();
    if (key == "chunk_size") options->chunk_size = number;
    if (key == "sink_tokens") options->sink_tokens = number;
    if (key == "recent_tokens") options->recent_tokens = number;
    if (key == "max_passes") options->max_passes = number;
  } else if (key == "uniform_heads") {
    if (!value.is_boolean()) return ConfigError(key, "true or false");
    options->uniform_heads = value.get<bool>();
  } else if (key == "passthrough_heads") {
    if (!value.is_array()) return ConfigError(key, "a list of head indices");
    for (const Json& head : value) {
      if (!head.is_number_integer()) return ConfigError(key, "a list of head indices");
      options->passthrough_heads.push_back(head.get<int32_t>());
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("case.json config: unknown parameter '", key, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat("case.json: unknown dtype '", name, "'"));
}

absl::Status CheckArray(const std::string& file, const NpyArray& array, NpyType type,
                        const std::vector<int64_t>& shape) {
  if (array.type != type || array.shape != shape) {
    std::string want, got;
    for (int64_t dim : shape) absl::StrAppend(&want, dim, ",");
    for (int64_t dim : array.shape) absl::StrAppend(&got, dim, ",");
    return absl::InvalidArgumentError(absl::StrCat(file, ": expected ", NpyDescr(type), " (", want,
                                                   ") but found ", NpyDescr(array.type), " (", got,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status LoadArray(const GoldenCase& golden, const std::string& file, NpyArray* out) {
  absl::StatusOr<NpyArray> array = ReadNpy(golden.dir + "/" + file);
  if (!array.ok()) return array.status();
  *out = *std::move(array);
  return absl::OkStatus();
}

absl::Status LoadArrays(GoldenCase* golden) {
  const std::pair<const char*, NpyArray*> files[] = {{"keys.npy", &golden->keys},
                                                     {"values.npy", &golden->values},
                                                     {"counts.npy", &golden->counts},
                                                     {"out_offsets.npy", &golden->out_offsets},
                                                     {"out_keys.npy", &golden->out_keys},
                                                     {"out_values.npy", &golden->out_values},
                                                     {"out_counts.npy", &golden->out_counts},
                                                     {"assignment.npy", &golden->assignment}};
  for (const auto& [file, array] : files) {
    if (absl::Status status = LoadArray(*golden, file, array); !status.ok()) return status;
  }
  return absl::OkStatus();
}

// Checks that every array agrees with the input shape [H, n, dk] / [H, n, dv].
absl::Status CheckShapes(GoldenCase* golden) {
  if (golden->keys.shape.size() != 3 || golden->values.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(golden->name, ": keys.npy and values.npy must be [H, n, d]"));
  }
  golden->num_heads = static_cast<int32_t>(golden->keys.shape[0]);
  golden->num_tokens = static_cast<int32_t>(golden->keys.shape[1]);
  golden->key_dim = static_cast<int32_t>(golden->keys.shape[2]);
  golden->value_dim = static_cast<int32_t>(golden->values.shape[2]);
  const int64_t h = golden->num_heads, n = golden->num_tokens;
  const NpyType input_type =
      golden->dtype == DType::kFloat32 ? NpyType::kFloat32 : NpyType::kFloat16;
  if (golden->dtype == DType::kBFloat16) {
    return absl::InvalidArgumentError("bfloat16 golden inputs have no .npy type");
  }
  const std::string& dir = golden->dir;
  std::vector<absl::Status> checks = {
      CheckArray(dir + "/keys.npy", golden->keys, input_type, {h, n, golden->key_dim}),
      CheckArray(dir + "/values.npy", golden->values, input_type, {h, n, golden->value_dim}),
      CheckArray(dir + "/counts.npy", golden->counts, NpyType::kUInt32, {h, n}),
      CheckArray(dir + "/out_offsets.npy", golden->out_offsets, NpyType::kInt64, {h + 1}),
      CheckArray(dir + "/assignment.npy", golden->assignment, NpyType::kInt64, {h, n})};
  for (const absl::Status& status : checks) {
    if (!status.ok()) return status;
  }
  const int64_t total = golden->out_offsets.As<int64_t>()[h];
  checks = {CheckArray(dir + "/out_keys.npy", golden->out_keys, NpyType::kFloat32,
                       {total, golden->key_dim}),
            CheckArray(dir + "/out_values.npy", golden->out_values, NpyType::kFloat32,
                       {total, golden->value_dim}),
            CheckArray(dir + "/out_counts.npy", golden->out_counts, NpyType::kUInt32, {total})};
  for (const absl::Status& status : checks) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

// The head that owns output row `row`, given offsets [H+1].
int64_t HeadOfRow(const std::vector<int64_t>& offsets, int64_t row) {
  const auto it = std::upper_bound(offsets.begin(), offsets.end(), row);
  return static_cast<int64_t>(it - offsets.begin()) - 1;
}

// Counts mismatches of one field and reports the first few through ADD_FAILURE.
class MismatchReporter {
 public:
  explicit MismatchReporter(std::string field) : field_(std::move(field)) {}
  ~MismatchReporter() {
    if (mismatches_ > kMaxReportedMismatches) {
      ADD_FAILURE() << field_ << ": " << mismatches_ << " mismatches in all (first "
                    << kMaxReportedMismatches << " shown)";
    }
  }
  // Returns whether this mismatch should be described (the caller streams the details).
  bool Count() { return ++mismatches_ <= kMaxReportedMismatches; }
  const std::string& field() const { return field_; }

 private:
  std::string field_;
  int64_t mismatches_ = 0;
};

void ExpectRowsNear(const char* field, const std::vector<float>& expected,
                    const std::vector<float>& actual, int32_t dim,
                    const std::vector<int64_t>& offsets, double rel_tolerance) {
  if (expected.size() != actual.size()) {
    ADD_FAILURE() << field << ": " << actual.size() << " elements, expected " << expected.size();
    return;
  }
  MismatchReporter reporter(field);
  for (size_t i = 0; i < expected.size(); ++i) {
    const double want = expected[i], got = actual[i];
    const double allowed = rel_tolerance * std::max(1.0, std::fabs(want));
    if (std::fabs(got - want) <= allowed) continue;  // NaN fails here too
    if (reporter.Count()) {
      const int64_t row = static_cast<int64_t>(i) / dim;
      const int64_t head = HeadOfRow(offsets, row);
      ADD_FAILURE() << field << " of head " << head << ", row " << row - offsets[head]
                    << " (global row " << row << "), dim " << static_cast<int64_t>(i) % dim
                    << ": got " << got << ", expected " << want << " (|diff| "
                    << std::fabs(got - want) << " > " << allowed << ")";
    }
  }
}

void ExpectCountsEqual(const CompressResult& expected, const CompressResult& actual) {
  if (expected.counts.size() != actual.counts.size()) {
    ADD_FAILURE() << "counts: " << actual.counts.size() << " entries, expected "
                  << expected.counts.size();
    return;
  }
  MismatchReporter reporter("counts");
  for (size_t row = 0; row < expected.counts.size(); ++row) {
    if (expected.counts[row] == actual.counts[row]) continue;
    if (reporter.Count()) {
      const int64_t head = HeadOfRow(expected.offsets, static_cast<int64_t>(row));
      ADD_FAILURE() << "counts of head " << head << ", row "
                    << static_cast<int64_t>(row) - expected.offsets[head] << ": got "
                    << actual.counts[row] << ", expected " << expected.counts[row];
    }
  }
}

void ExpectAssignmentEqual(const CompressResult& expected, const CompressResult& actual) {
  if (expected.assignment.empty()) return;
  if (expected.assignment.size() != actual.assignment.size()) {
    ADD_FAILURE() << "assignment: " << actual.assignment.size() << " entries, expected "
                  << expected.assignment.size();
    return;
  }
  MismatchReporter reporter("assignment");
  const int64_t n = expected.num_tokens;
  for (size_t i = 0; i < expected.assignment.size(); ++i) {
    if (expected.assignment[i] == actual.assignment[i]) continue;
    if (reporter.Count()) {
      ADD_FAILURE() << "assignment of head " << static_cast<int64_t>(i) / n << ", input entry "
                    << static_cast<int64_t>(i) % n << ": got " << actual.assignment[i]
                    << ", expected " << expected.assignment[i];
    }
  }
}

}  // namespace

std::string GoldenRoot() {
  // The environment may point elsewhere: a test binary run on another machine (the GPU check
  // carries the golden cases next to it, scripts/gpu-check.sh).
  const char* shared = std::getenv("CKV_SHARED_DIR");
  return std::string(shared != nullptr && shared[0] != '\0' ? shared : CKV_SHARED_DIR) + "/golden";
}

std::vector<std::string> ListGoldenCases() {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(GoldenRoot(), error)) {
    if (entry.is_directory() && std::filesystem::exists(entry.path() / "case.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<CompressOptions> ParseGoldenConfig(const std::string& json_text) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("case.json is not a JSON object");
  }
  const auto config = root.find("config");
  if (config == root.end() || !config->is_object()) {
    return absl::InvalidArgumentError("case.json has no \"config\" object");
  }
  CompressOptions options;
  for (const auto& [key, value] : config->items()) {
    if (absl::Status status = ApplyConfigEntry(key, value, &options); !status.ok()) {
      return status;
    }
  }
  return options;
}

absl::StatusOr<GoldenCase> LoadGoldenCase(const std::string& name) {
  GoldenCase golden;
  golden.name = name;
  golden.dir = GoldenRoot() + "/" + name;
  absl::StatusOr<std::string> text = ReadTextFile(golden.dir + "/case.json");
  if (!text.ok()) return text.status();
  absl::StatusOr<CompressOptions> options = ParseGoldenConfig(*text);
  if (!options.ok()) return options.status();
  golden.options = *std::move(options);

  const Json root = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  const auto dtype = root.find("dtype");
  absl::StatusOr<DType> parsed_dtype =
      ParseDType(dtype != root.end() && dtype->is_string() ? dtype->get<std::string>() : "float32");
  if (!parsed_dtype.ok()) return parsed_dtype.status();
  golden.dtype = *parsed_dtype;

  if (absl::Status status = LoadArrays(&golden); !status.ok()) return status;
  if (absl::Status status = CheckShapes(&golden); !status.ok()) return status;
  return golden;
}

LayerView GoldenLayerView(const GoldenCase& golden) {
  LayerView layer{.dtype = golden.dtype, .layout = TensorLayout::kHeadMajor,
      .num_heads = golden.num_heads, .num_tokens = golden.num_tokens, .key_dim = golden.key_dim,
      .value_dim = golden.value_dim, .keys = golden.keys.bytes.data(),
      .values = golden.values.bytes.data(), .counts = golden.counts.As<uint32_t>()};
  return layer;
}

CompressResult GoldenExpectedResult(const GoldenCase& golden) {
  CompressResult expected;
  expected.num_heads = golden.num_heads;
  expected.num_tokens = golden.num_tokens;
  expected.key_dim = golden.key_dim;
  expected.value_dim = golden.value_dim;
  const int64_t* offsets = golden.out_offsets.As<int64_t>();
  expected.offsets.assign(offsets, offsets + golden.out_offsets.NumElements());
  const float* keys = golden.out_keys.As<float>();
  expected.keys.assign(keys, keys + golden.out_keys.NumElements());
  const float* values = golden.out_values.As<float>();
  expected.values.assign(values, values + golden.out_values.NumElements());
  const uint32_t* counts = golden.out_counts.As<uint32_t>();
  expected.counts.assign(counts, counts + golden.out_counts.NumElements());
  const int64_t* assignment = golden.assignment.As<int64_t>();
  for (int64_t i = 0; i < golden.assignment.NumElements(); ++i) {
    expected.assignment.push_back(static_cast<int32_t>(assignment[i]));
  }
  return expected;
}

void ExpectResultsNear(const CompressResult& expected, const CompressResult& actual,
                       double rel_tolerance) {
  EXPECT_EQ(actual.num_heads, expected.num_heads);
  EXPECT_EQ(actual.num_tokens, expected.num_tokens);
  EXPECT_EQ(actual.key_dim, expected.key_dim);
  EXPECT_EQ(actual.value_dim, expected.value_dim);
  if (actual.offsets != expected.offsets) {
    std::string lengths;
    for (size_t h = 0; h + 1 < expected.offsets.size() || h + 1 < actual.offsets.size(); ++h) {
      auto length = [h](const std::vector<int64_t>& offsets) -> std::string {
        return h + 1 < offsets.size() ? absl::StrCat(offsets[h + 1] - offsets[h]) : "-";
      };
      absl::StrAppend(&lengths, "\n  head ", h, ": ", length(actual.offsets), " rows, expected ",
                      length(expected.offsets));
    }
    ADD_FAILURE() << "offsets differ (rows per head):" << lengths;
    return;  // the row-wise comparisons below would be misaligned
  }
  ExpectCountsEqual(expected, actual);
  ExpectAssignmentEqual(expected, actual);
  ExpectRowsNear("keys", expected.keys, actual.keys, expected.key_dim, expected.offsets,
                 rel_tolerance);
  ExpectRowsNear("values", expected.values, actual.values, expected.value_dim, expected.offsets,
                 rel_tolerance);
}

void ExpectMatchesGolden(const GoldenCase& golden, const CompressResult& result) {
  ExpectResultsNear(GoldenExpectedResult(golden), result, kGoldenRelTolerance);
}

}  // namespace centroidkv::test
