// centroidkv-bench's flags (bench/service/load.h): the model presets, every flag on the
// CLI11 app, and the config they resolve to, with each bad value named by its flag.
#include <cmath>
#include <optional>
#include <span>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/service/load.h"
#include "centroidkv/common/dtype.h"
#include "centroidkv/common/status_macros.h"
#include "centroidkv/types/kinds.h"
#include "client/cli/compress_option_flags.h"

namespace centroidkv::bench {
namespace {

// The kind `name` spells in `table` (types/kinds.h), or an error naming the flag.
template <typename Kind>
absl::StatusOr<Kind> ParseFlag(std::span<const KindName<Kind>> table, const std::string& name,
                               const char* flag) {
  std::optional<Kind> kind = ParseKind<Kind>(table, name);
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", name, "' is not one of ", KindNameList(table)));
  }
  return *kind;
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = {
      {"llama3-8b", 32, 8, 128},
      {"qwen2.5-7b", 28, 4, 128},
      {"llama3-70b", 80, 8, 128},
  };
  return presets;
}

absl::StatusOr<ModelPreset> FindPreset(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelPreset& preset : ModelPresets()) {
    if (preset.name == name) return preset;
    names.push_back(preset.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("--preset: unknown preset '", name,
                                                 "'; known: ", absl::StrJoin(names, ", ")));
}

int64_t LoadConfig::BytesPerJob() const {
  return 2 * TokensPerJob() * preset.head_dim * static_cast<int64_t>(DTypeSize(dtype));
}

void AddLoadFlags(CLI::App* app, LoadFlags* flags) {
  LoadConfig& c = flags->config;
  app->add_option("--server", c.server,
                  "Server address (HOST:PORT or unix:///path), or replicas to balance over: "
                  "HOST:PORT,HOST:PORT,... or dns:///NAME:PORT")
      ->capture_default_str();
  app->add_option("--concurrency,-c", c.concurrency, "Streams (threads in-process)")
      ->capture_default_str();
  app->add_option("--pipeline", c.pipeline, "Jobs in flight per stream")->capture_default_str();
  auto* jobs = app->add_option("--jobs,-n", c.jobs, "Total layer jobs (default: one sequence, "
                                                    "i.e. the preset's layer count)");
  app->add_option("--duration", c.duration_s, "Run for this many seconds instead of --jobs")
      ->excludes(jobs);
  app->add_option("--rate", c.rate, "Jobs per second over all streams; 0 = as fast as possible")
      ->capture_default_str();
  app->add_option("--preset", flags->preset, "llama3-8b | qwen2.5-7b | llama3-70b")
      ->capture_default_str();
  app->add_option("--context", flags->context,
                  "Tokens per head (context length; default 4096, or 256 new tokens with "
                  "--decode)");
  app->add_option("--dtype", flags->dtype,
                  "float16 | float32 | bfloat16 | fp8_e4m3 | fp8_e5m2 (fp8: codes with per-head "
                  "scales)")
      ->capture_default_str();
  app->add_option("--seed", c.seed, "Seed of the synthetic clustered KV")->capture_default_str();
  app->add_option("--distinct-layers", c.distinct_layers,
                  "Distinct layers of data generated (reused round-robin)")
      ->capture_default_str();
  // SPEC parameters, the flags of `centroidkv compress`; the assignment is off by default here.
  c.options.compute_assignment = false;
  cli::AddCompressOptionFlags(app, &c.options, {.output_layout = false});
  app->add_option("--output-dtype", flags->output_dtype,
                  "input (default), or a dtype: float32, float16, bfloat16 (fp32, fp16, bf16), "
                  "fp8_e4m3, fp8_e5m2")
      ->capture_default_str();
  app->add_option("--output-scale", flags->output_scale,
                  "fp8 results in this static scale (keys and values, every head, as a serving "
                  "engine's k_scale / v_scale); default: per-head dynamic scales");
  app->add_option("--backend", flags->backend, "auto | cpu | cuda (gpu) | reference | identity")
      ->capture_default_str();
  client::AddSecurityFlags(app, &c.security);
  app->add_option("--slab-kib", c.slab_kib, "Slab size sent to the server, KiB")
      ->capture_default_str();
  app->add_option("--threads", c.threads,
                  "Clustering threads of the in-process engine (--compare); 0 = the server's")
      ->capture_default_str();
  app->add_option("--connect-timeout", c.connect_timeout_s,
                  "Seconds to wait for the server to become ready")
      ->capture_default_str();
  app->add_flag("--compare", c.compare,
                "Run service (cpu), transport floor (identity: a real job's bytes, no "
                "clustering) and in-process cpu side by side");
  app->add_flag("--decode", c.decode,
                "Decode-time jobs: per round, --concurrency x --pipeline in flight and one "
                "at a time, each through the in-process engine, the service over slabs and "
                "(with --shm) over shared memory; ends with one JSON line");
  app->add_flag("--shm", c.shm,
                "Jobs by reference to shared memory (server on a unix socket); with --compare "
                "two more legs, service:cpu+shm and service:identity+shm");
  app->add_option("--rounds", c.rounds,
                  "--compare: rounds of the three runs in turn; medians are reported")
      ->capture_default_str();
  app->add_option("--format", c.format, "text | json | csv")->capture_default_str();
  app->add_flag("--progress", c.progress, "Show the progress bar even when stderr is no tty");
  app->add_flag("--quiet,-q", c.quiet, "No progress bar");
}

// "--flag: 5000 is not in [1, 1024]", with an optional note after the range.
absl::Status CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi,
                        const char* note = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", value, " is not in [", lo, ", ",
                                                 hi, "]", *note != '\0' ? " " : "", note));
}

absl::StatusOr<LoadConfig> FinishConfig(LoadFlags& flags) {
  LoadConfig config = flags.config;
  config.context = flags.context.value_or(config.decode ? 256 : 4096);
  if (config.decode && config.compare) {
    return absl::InvalidArgumentError("--decode and --compare exclude each other (--decode "
                                      "runs its own legs)");
  }
  absl::StatusOr<ModelPreset> preset = FindPreset(flags.preset);
  if (!preset.ok()) return preset.status();
  config.preset = *preset;
  CKV_ASSIGN_OR_RETURN(config.dtype, ParseFlag<DType>(kDTypeNames, flags.dtype, "--dtype"));
  if (flags.output_dtype == "input") {
    config.output_dtype.reset();
  } else {
    CKV_ASSIGN_OR_RETURN(config.output_dtype,
                         ParseFlag<DType>(kDTypeNames, flags.output_dtype, "--output-dtype"));
  }
  const DType output_dtype = config.output_dtype.value_or(config.dtype);
  if (flags.output_scale.has_value()) {
    if (!IsFp8(output_dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--output-scale: only for fp8 results (the output dtype is ",
          std::string(DTypeName(output_dtype)), ")"));
    }
    config.options.result_key_scales = {*flags.output_scale};
    config.options.result_value_scales = {*flags.output_scale};
  }
  CKV_ASSIGN_OR_RETURN(config.backend,
                       ParseFlag<BackendKind>(kBackendKindNames, flags.backend, "--backend"));
  if (config.format != "text" && config.format != "json" && config.format != "csv") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: '", config.format, "' is not text, json or csv"));
  }
  CKV_RETURN_IF_ERROR(CheckRange("--concurrency", config.concurrency, 1, 1024));
  CKV_RETURN_IF_ERROR(CheckRange("--pipeline", config.pipeline, 1, 64));
  if (config.jobs < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs: ", config.jobs, " is negative"));
  }
  if (!(config.duration_s >= 0) || !std::isfinite(config.duration_s)) {
    return absl::InvalidArgumentError("--duration: must be a finite number of seconds >= 0");
  }
  if (config.jobs > 0 && config.duration_s > 0) {
    return absl::InvalidArgumentError("--jobs and --duration exclude each other");
  }
  if (config.jobs == 0 && config.duration_s == 0) config.jobs = config.preset.layers;
  if (!(config.rate >= 0) || !std::isfinite(config.rate)) {
    return absl::InvalidArgumentError("--rate: must be >= 0 jobs per second (0: unlimited)");
  }
  if (config.context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context: ", config.context, " tokens; needs at least 1"));
  }
  if (!(config.connect_timeout_s > 0) || !std::isfinite(config.connect_timeout_s)) {
    return absl::InvalidArgumentError("--connect-timeout: must be > 0 seconds");
  }
  if (config.distinct_layers < 1) {
    return absl::InvalidArgumentError("--distinct-layers: needs at least 1");
  }
  CKV_RETURN_IF_ERROR(CheckRange("--rounds", config.rounds, 1, 100));
  CKV_RETURN_IF_ERROR(CheckRange("--threads", config.threads, 0, 1024, "(0: the server's)"));
  CKV_RETURN_IF_ERROR(CheckRange("--slab-kib", config.slab_kib, 4, 4096));
  if (config.compare || config.decode) config.backend = BackendKind::kCpu;
  // The engine's own checks, on the shape alone: the same messages the server would send.
  const std::vector<float> unit_scale = {1.0f};  // fp8 input: the dataset's scales come later
  LayerView shape{.dtype = config.dtype, .num_heads = config.preset.kv_heads,
      .num_tokens = config.context, .key_dim = config.preset.head_dim,
      .value_dim = config.preset.head_dim};
  if (IsFp8(config.dtype)) shape.key_scales = shape.value_scales = unit_scale;
  CompressOptions options = config.options;
  options.result_dtype = output_dtype;
  absl::Status valid = ValidateJobShape(shape, options, EngineLimits{});
  if (!valid.ok()) return valid;
  return config;
}

absl::StatusOr<LoadConfig> ParseLoadArgs(const std::vector<std::string>& args) {
  CLI::App app("centroidkv-bench");
  LoadFlags flags;
  AddLoadFlags(&app, &flags);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 wants them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return FinishConfig(flags);
}

}  // namespace centroidkv::bench
