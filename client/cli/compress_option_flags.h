// The clustering parameters as command-line flags (SPEC's names with dashes), bound straight
// into a CompressOptions: the CLI's compress command and the quality tool take the same
// flags, defaults and checks, with no flags struct to copy from. Header-only.
#pragma once

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/presets.h"

namespace centroidkv::cli {

// Which flags a tool takes beyond the SPEC parameters every tool has.
struct CompressOptionFlagSet {
  bool targets = true;            // --target-ratio / --target-tokens (one of them)
  bool passthrough_heads = true;  // --passthrough-heads H,H,...
  bool assignment = true;         // --assignment true/false
  bool output_layout = true;      // --token-major-output
};

// --preset NAME ("spec", "small-model"; types/presets.h): applies the preset to `*options`
// and records its name in `*name`. Add it before AddCompressOptionFlags: CLI11 runs the
// callbacks in the order the options were added, so an explicit --chunk-size,
// --sink-tokens or --recent-tokens then overrides the preset. `*name` holds the tool's
// starting preset, applied to `*options` already.
inline void AddPresetFlag(CLI::App* app, CompressOptions* options, std::string* name) {
  std::string names;
  for (const Preset& preset : kPresets) {
    names += absl::StrCat(names.empty() ? "" : ", ", std::string(preset.name));
  }
  app->add_option_function<std::string>(
         "--preset",
         [options, name](const std::string& value) {
           *options = FindPreset(value)->Apply(*options);
           *name = value;
         },
         absl::StrCat("Named parameter set the flags below override: ", names,
                      " (default ", *name, ")"))
      ->check([](const std::string& value) {
        return FindPreset(value).has_value() ? std::string() : "unknown preset " + value;
      });
}

// "small-model (chunk 32, sink 4, recent 32)", and what the flags changed:
// "small-model (chunk 32, sink 4, recent 16: recent_tokens overridden)".
inline std::string DescribePreset(const std::string& name, const CompressOptions& options) {
  const std::optional<Preset> preset = FindPreset(name);
  std::string changed;
  if (preset.has_value()) {
    if (options.chunk_size != preset->chunk_size) changed += " chunk_size";
    if (options.sink_tokens != preset->sink_tokens) changed += " sink_tokens";
    if (options.recent_tokens != preset->recent_tokens) changed += " recent_tokens";
  }
  return absl::StrFormat("%s (chunk %d, sink %d, recent %d%s)", name, options.chunk_size,
                         options.sink_tokens, options.recent_tokens,
                         changed.empty() ? "" : absl::StrCat(":", changed, " overridden"));
}

// Adds the flags of `which` to `app`, each writing its field of `*options` (which must
// outlive parsing). Fields whose flag is absent keep the values `*options` has.
inline void AddCompressOptionFlags(CLI::App* app, CompressOptions* options,
                                   CompressOptionFlagSet which = {}) {
  if (which.targets) {
    CLI::Option* ratio =
        app->add_option("--target-ratio", options->target_ratio,
                        absl::StrCat("rho in (0, 1]: keep ceil(rho * n) (with neither target: ",
                                     CompressOptions::kDefaultTargetRatio, ")"));
    app->add_option("--target-tokens", options->target_tokens, "Absolute target length t")
        ->excludes(ratio);
  }
  app->add_option("--chunk-size", options->chunk_size, "Chunk size C >= 2")->capture_default_str();
  app->add_option("--sink-tokens", options->sink_tokens, "Leading entries never merged (S)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--recent-tokens", options->recent_tokens, "Trailing entries never merged (W)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_option("--min-similarity", options->min_similarity,
                  "Similarity floor tau in [-1, 1] (default off)");
  app->add_option("--tighten-per-pass", options->tighten_per_pass, "Floor increase per pass")
      ->capture_default_str();
  app->add_option("--max-passes", options->max_passes, "Passes P >= 1")->capture_default_str();
  app->add_option("--uniform-heads", options->uniform_heads,
                  "true: every compressed head ends with the same length")
      ->capture_default_str();
  app->add_flag("--exact-target", options->exact_target,
                "Merge past the floor and max_passes until each compressed head has t rows");
  app->add_flag("--pad-heads", options->pad_heads,
                "Pad every head with count-0 rows to the longest head's length");
  app->add_option("--pad-to", options->pad_to,
                  "Pad every head to exactly this many rows (fails if a head is longer)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  if (which.passthrough_heads) {
    app->add_option("--passthrough-heads", options->passthrough_heads,
                    "Heads returned unchanged, e.g. 1,3")
        ->delimiter(',');
  }
  if (which.assignment) {
    app->add_option("--assignment", options->compute_assignment,
                    "Ask for the assignment (true/false)")
        ->capture_default_str();
  }
  if (which.output_layout) {
    app->add_flag_function(
        "--token-major-output",
        [options](int64_t) { options->output_layout = TensorLayout::kTokenMajor; },
        "Rows [L, H, d] (token-major, heads padded to L) instead of heads concatenated");
  }
}

}  // namespace centroidkv::cli
