// The enumerations of the domain (element type, tensor layout, backend, stop reason), each
// with one table of names: the one place a name becomes a kind and a kind a name, used by
// the CLI, the quality tool, the benchmarks and logs alike. Header-only; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "centroidkv/common/dtype.h"

namespace centroidkv {

// How the H x n x d elements of a key or value tensor are laid out in memory.
//   kHeadMajor:  [H, n, d], element (h, t, j) at (h * n + t) * d + j; counts [H, n].
//   kTokenMajor: [n, H, d], element (h, t, j) at (t * H + h) * d + j; counts [n, H].
enum class TensorLayout : uint8_t { kHeadMajor, kTokenMajor };

// Which engine serves a job (EngineSet::Select). The wire's BACKEND_GPU is kCuda.
enum class BackendKind : uint8_t {
  kAuto,       // the CUDA backend when a device is present, otherwise the CPU backend
  kCpu,        // the CPU backend (oneTBB + SIMD)
  kCuda,       // a CUDA device; FAILED_PRECONDITION when there is none
  kReference,  // the scalar float64 oracle (slow; for checking)
  kIdentity,   // returns its input unchanged; for measuring the transport floor only
};

// Why a head stopped merging (the wire's StopReason).
enum class StopReason : uint8_t {
  kTargetReached = 1,    // at most t entries
  kPassthrough = 2,      // a passthrough head, returned unchanged
  kSimilarityFloor = 3,  // no candidate edge reached the floor (this head's or, with
                         // uniform_heads, another compressed head's)
  kMaxPasses = 4,        // max_passes passes ran, each merging something
  kProtected = 5,        // sink and recent entries leave fewer than 2 to merge
  kUniformHeads = 6,     // uniform_heads: another compressed head could not merge
};

// One spelling of a kind. The first entry of a kind in its table is its canonical name;
// later ones are accepted aliases.
template <typename Kind>
struct KindName {
  std::string_view name;
  Kind kind;
};

inline constexpr KindName<DType> kDTypeNames[] = {
    {"float32", DType::kFloat32},        {"float16", DType::kFloat16},
    {"bfloat16", DType::kBFloat16},      {"fp8_e4m3", DType::kFp8E4M3},
    {"fp8_e5m2", DType::kFp8E5M2},       {"fp32", DType::kFloat32},
    {"fp16", DType::kFloat16},           {"bf16", DType::kBFloat16},
    {"float8_e4m3fn", DType::kFp8E4M3},  {"float8_e5m2", DType::kFp8E5M2},
    {"fp8", DType::kFp8E4M3}};
inline constexpr KindName<TensorLayout> kTensorLayoutNames[] = {
    {"head_major", TensorLayout::kHeadMajor}, {"token_major", TensorLayout::kTokenMajor}};
inline constexpr KindName<BackendKind> kBackendKindNames[] = {
    {"auto", BackendKind::kAuto},
    {"cpu", BackendKind::kCpu},
    {"cuda", BackendKind::kCuda},
    {"reference", BackendKind::kReference},
    {"identity", BackendKind::kIdentity},
    {"gpu", BackendKind::kCuda}};
inline constexpr KindName<StopReason> kStopReasonNames[] = {
    {"target_reached", StopReason::kTargetReached},
    {"passthrough", StopReason::kPassthrough},
    {"similarity_floor", StopReason::kSimilarityFloor},
    {"max_passes", StopReason::kMaxPasses},
    {"protected", StopReason::kProtected},
    {"uniform_heads", StopReason::kUniformHeads}};

// The kind `name` spells in `table`, or nullopt.
template <typename Kind>
std::optional<Kind> ParseKind(std::span<const KindName<Kind>> table, std::string_view name) {
  for (const KindName<Kind>& entry : table) {
    if (entry.name == name) return entry.kind;
  }
  return std::nullopt;
}

// The canonical name of `kind` in `table` ("unknown" for a value outside it).
template <typename Kind>
std::string_view KindNameOf(std::span<const KindName<Kind>> table, Kind kind) {
  for (const KindName<Kind>& entry : table) {
    if (entry.kind == kind) return entry.name;
  }
  return "unknown";
}

// "name1|name2|...": every spelling in `table`, for help texts and error messages.
template <typename Kind>
std::string KindNameList(std::span<const KindName<Kind>> table) {
  std::string list;
  for (const KindName<Kind>& entry : table) {
    if (!list.empty()) list += '|';
    list += entry.name;
  }
  return list;
}

inline std::string_view TensorLayoutName(TensorLayout layout) {
  return KindNameOf<TensorLayout>(kTensorLayoutNames, layout);
}
inline std::string_view BackendKindName(BackendKind kind) {
  return KindNameOf<BackendKind>(kBackendKindNames, kind);
}
inline std::string_view StopReasonName(StopReason reason) {
  return KindNameOf<StopReason>(kStopReasonNames, reason);
}
inline std::optional<DType> ParseDType(std::string_view name) {
  return ParseKind<DType>(kDTypeNames, name);
}
inline std::optional<TensorLayout> ParseTensorLayout(std::string_view name) {
  return ParseKind<TensorLayout>(kTensorLayoutNames, name);
}
inline std::optional<BackendKind> ParseBackendKind(std::string_view name) {
  return ParseKind<BackendKind>(kBackendKindNames, name);
}

}  // namespace centroidkv
