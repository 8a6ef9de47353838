// GoogleTest checks on CompressResult shared by the engine test suites: two results of the
// same job compared field by field, floats bit for bit (the first differing element is
// printed).
#pragma once

#include "centroidkv/kernels/engine.h"

namespace centroidkv::test {

// Offsets, counts, assignment and passes_run equal; keys and values bit-identical.
void ExpectBitIdentical(const CompressResult& expected, const CompressResult& actual);

}  // namespace centroidkv::test
