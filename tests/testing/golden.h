// The golden cases of ../shared/golden (SPEC.md section 2, produced by an independent float64
// implementation): loading a case folder, viewing its input as a LayerView, and comparing an
// engine's CompressResult with an expected one (GoogleTest EXPECT_* semantics).
// Thread-compatible: a GoldenCase is a plain value; a LayerView borrows its buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

// Relative tolerance for float32 keys/values against an exact (float64-computed) result:
// |actual - expected| <= tolerance * max(1, |expected|).
inline constexpr double kGoldenRelTolerance = 1e-5;

struct GoldenCase {
  std::string name;               // the folder name, e.g. "small_basic"
  std::string dir;                // path of the folder
  CompressOptions options;        // case.json "config"; absent parameters keep SPEC defaults
  DType dtype = DType::kFloat32;  // element type of keys.npy / values.npy
  int32_t num_heads = 0;
  int32_t num_tokens = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;

  // Inputs, head-major: keys [H, n, dk], values [H, n, dv] (float32 or float16), counts
  // [H, n] uint32.
  NpyArray keys;
  NpyArray values;
  NpyArray counts;
  // Expected output: offsets [H+1] int64, keys [total, dk] and values [total, dv] float32,
  // counts [total] uint32, assignment [H, n] int64 (head-local output row).
  NpyArray out_offsets;
  NpyArray out_keys;
  NpyArray out_values;
  NpyArray out_counts;
  NpyArray assignment;
};

// CKV_SHARED_DIR "/golden"; the environment variable CKV_SHARED_DIR, when set, overrides the
// compiled-in path.
std::string GoldenRoot();

// The names of every case folder under GoldenRoot() (folders holding a case.json), sorted.
// Empty when the folder is missing (the caller should fail on that).
std::vector<std::string> ListGoldenCases();

// Loads one case folder and checks that its arrays agree in shape and type.
absl::StatusOr<GoldenCase> LoadGoldenCase(const std::string& name);

// Parses a case.json text: its "config" object into CompressOptions (absent parameters keep
// the SPEC defaults). Unknown parameters are an error, so that a parameter added to the
// golden data cannot be silently ignored.
absl::StatusOr<CompressOptions> ParseGoldenConfig(const std::string& json_text);

// A head-major view of the case input; borrows `golden`'s buffers.
LayerView GoldenLayerView(const GoldenCase& golden);

// The expected output of the case as a CompressResult (float32; assignment narrowed to
// int32; passes_run is unknown and left 0).
CompressResult GoldenExpectedResult(const GoldenCase& golden);

// EXPECTs that `actual` equals `expected`: shape fields, offsets, counts and (when `expected`
// has one) assignment exactly; keys and values within `rel_tolerance` (see above). Reports at
// most a few mismatches per field, each with head and row, then how many there were in all.
void ExpectResultsNear(const CompressResult& expected, const CompressResult& actual,
                       double rel_tolerance);

// ExpectResultsNear(GoldenExpectedResult(golden), result, kGoldenRelTolerance).
void ExpectMatchesGolden(const GoldenCase& golden, const CompressResult& result);

}  // namespace centroidkv::test
