// GoogleTest checks shared by the test suites: two results of the same job compared field
// by field, floats bit for bit (the first differing element is printed), and two option sets
// compared field by field.
#pragma once

#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

// Offsets, counts, assignment, passes_run and the budget account equal; keys,
// values and log-weights bit-identical.
void ExpectBitIdentical(const CompressResult& expected, const CompressResult& actual);

// Every field of two option sets equal, each named on failure.
void ExpectOptionsEqual(const CompressOptions& expected, const CompressOptions& actual);

}  // namespace centroidkv::test
