// The fp8 golden cases of tests/data/golden_fp8 (made by make_cases.py there: the real-KV
// golden case quantised to fp8, compressed by the reference backend into fp8 results):
// loading one, viewing its input, its expected result, and comparing results bit for bit.
// Thread-compatible: a Fp8GoldenCase is a plain value; a LayerView borrows its buffers.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/common/npy.h"
#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

struct Fp8GoldenCase {
  std::string name;
  CompressOptions options;  // case.json "config", result_dtype and the result scales
  DType dtype = DType::kFp8E4M3;
  std::vector<float> key_scales, value_scales;  // of the input
  NpyArray keys, values;                        // [H, n, d] uint8 codes
  CompressResult expected;                      // fp8 rows, scales, counts, assignment
};

// CKV_TEST_DATA_DIR "/golden_fp8".
std::string Fp8GoldenRoot();

// The case folders under Fp8GoldenRoot(), sorted; empty when it is missing.
std::vector<std::string> ListFp8GoldenCases();

absl::StatusOr<Fp8GoldenCase> LoadFp8GoldenCase(const std::string& name);

// The case's input (head-major, with its scales); borrows `golden`.
LayerView Fp8GoldenLayerView(const Fp8GoldenCase& golden);

// EXPECTs `actual` to be `expected` bit for bit: dtype, offsets, counts, assignment, the fp8
// codes of keys and values and the scales.
void ExpectFp8ResultsEqual(const CompressResult& expected, const CompressResult& actual);

}  // namespace centroidkv::test
