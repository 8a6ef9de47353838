// Fills a LayerResult's shape, offsets, passes and honest account from a CompressResult (an
// engine's, or a decoded JobResult header): one copy for the wire path (GrpcCompressStream)
// and the in-process one (LayerResultFromEngine). Rows, dtype and provenance are the
// caller's. Thread-safe: a pure function.
#pragma once

#include "centroidkv/client/client.h"

namespace centroidkv::client {

void CopyShapeAndAccount(const CompressResult& from, LayerResult* to);

}  // namespace centroidkv::client
