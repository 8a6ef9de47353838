// The size limits a server or an engine enforces on a job before any backend runs.
// Header-only; a value type.
#pragma once

#include <cstdint>

namespace centroidkv {

// Size limits enforced before any backend runs (RESOURCE_EXHAUSTED / INVALID_ARGUMENT).
struct EngineLimits {
  int32_t max_heads = 1024;
  int32_t max_tokens = 1 << 22;  // 4M entries per head
  int32_t max_dim = 4096;        // key_dim and value_dim
  int64_t max_layer_elements = int64_t{1} << 31;  // H * n * (dk + dv)
  // Largest CompressOptions::chunk_size (RESOURCE_EXHAUSTED above it). Matching costs
  // about n * C * key_dim / 4 per head and pass, so this bounds one job's work. Cancellation
  // does not depend on it: the cpu backend checks inside a chunk's matching and merging.
  int32_t max_chunk_size = 4096;
};

}  // namespace centroidkv
