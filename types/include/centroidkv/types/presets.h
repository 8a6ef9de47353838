// The named parameter sets every tool starts from (as llama.cpp's tools start from
// common_params), then overrides visibly: the SPEC's defaults, which the service runs, and
// the small-model set the quality tools and reports run (tuned on calibration texts of
// stories260K, docs/results/quality_tuning.md). Mirrored once in the Python package
// (client/python/centroidkv/presets.py; tests/python/test_presets.py keeps them equal).
// Header-only.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "centroidkv/types/compress_options.h"

namespace centroidkv {

struct Preset {
  std::string_view name;
  int32_t chunk_size;
  int32_t sink_tokens;
  int32_t recent_tokens;

  // `base` with this preset's chunk, sinks and recent window.
  CompressOptions Apply(CompressOptions base = {}) const {
    base.chunk_size = chunk_size;
    base.sink_tokens = sink_tokens;
    base.recent_tokens = recent_tokens;
    return base;
  }
};

// SPEC section 2's defaults (CompressOptions' own): what a job without parameters runs.
inline constexpr Preset kSpecPreset{"spec", CompressOptions::kDefaultChunkSize,
                                    CompressOptions::kDefaultSinkTokens,
                                    CompressOptions::kDefaultRecentTokens};
// The quality tools' and reports' set for small models with short prefills (a few hundred
// tokens: the SPEC's chunk of 256 would hold most of the prefill).
inline constexpr Preset kSmallModelPreset{"small-model", 32, 4, 32};

inline constexpr std::array<Preset, 2> kPresets = {kSpecPreset, kSmallModelPreset};

// The preset called `name` ("spec", "small-model"), or nullopt.
inline std::optional<Preset> FindPreset(std::string_view name) {
  for (const Preset& preset : kPresets) {
    if (preset.name == name) return preset;
  }
  return std::nullopt;
}

}  // namespace centroidkv
