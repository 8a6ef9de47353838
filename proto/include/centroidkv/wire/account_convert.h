// The honest account of a JobResult header (target, entries, input tokens and stop reason
// per head, padding, layout) in engine terms, for whoever decodes results: the C++ client
// and the service tests. Thread-safe: a pure function.
#pragma once

#include "centroidkv/kernels/engine.h"
#include "centroidkv/v1/centroidkv.pb.h"

namespace centroidkv {

// Fills `result`'s account fields of the same names from `header`.
void AccountFromProto(const v1::JobResult& header, CompressResult* result);

}  // namespace centroidkv
