// centroidkv-quality: the quality report of SPEC section 4 on a real llama2.c model.
// Samples texts from the model (or reads --tokens-file), optionally calibrates outlier
// heads on other seeds, compares CentroidKV (through a running server) with StreamingLLM,
// H2O-style eviction and k-means at each budget, writes the markdown report and a JSON
// file for the plot, and prints last one JSON line: [{method, budget, mean_kl, top1, ...}].
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/common/status_macros.h"
#include "client/cli/compress_option_flags.h"
#include "client/cli/kind_flags.h"
#include "client/cli/security_flags.h"
#include "worker/model.h"
#include "worker/quality/calibration.h"
#include "worker/quality/online_report.h"
#include "worker/quality/quality_run.h"
#include "worker/quality/report.h"
#include "worker/quality/texts.h"
#include "worker/tokenizer.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {
namespace {

struct Flags {
  client::SecurityFlags security;
  std::string model = "../shared/models/stories260K.bin";
  std::string tokenizer = "../shared/models/tok512.bin";
  std::string server = "127.0.0.1:50051";
  std::string tokens_file;
  int32_t texts = 32;
  uint64_t seed = 1000;
  float temperature = 0.8f;
  int32_t prefill = 384;
  int32_t continuation = 96;
  std::vector<double> budgets = {0.5, 0.25};
  std::vector<std::string> methods;
  // C, S and W tuned on calibration texts (docs/results/quality_tuning.md); S and W are also the
  // baselines' sinks and recent window.
  CompressOptions compression = kSmallModelPreset.Apply();
  std::string preset{kSmallModelPreset.name};
  std::string passthrough_heads;
  bool outliers_share_budget = true;
  int32_t calibration_texts = 16;
  uint64_t calibration_seed = 5000;
  int32_t outlier_heads = 3;
  double calibration_budget = 0.0;
  bool calibrate_only = false;
  int32_t kmeans_iterations = 25;
  double merge_min_similarity = -1.0;
  BackendKind backend = BackendKind::kAuto;
  // The dtype CentroidKV's centroids come back in (fp8: with static --output-scales, or
  // per-head dynamic scales).
  DType output_dtype = DType::kFloat32;
  std::vector<float> output_scales;
  std::string report_md = "docs/results/quality.md";
  std::string report_json = "docs/results/quality.json";
  bool quiet = false;
  bool online = false;
  int32_t online_prompt = 16;
  int32_t online_length = 0;
  std::string online_report_md = "docs/results/quality-online.md";
  std::string online_report_json = "docs/results/quality-online.json";
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.model, "llama2.c checkpoint")->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer,
                 "llama2.c tokenizer (decodes the report's sample text)")
      ->capture_default_str();
  app.add_option("--server", f.server,
                 "CentroidKV server address, or replicas: HOST:PORT,HOST:PORT or dns:///NAME:PORT")
      ->capture_default_str();
  client::AddSecurityFlags(&app, &f.security);
  app.add_option("--tokens-file", f.tokens_file,
                 "texts as token ids, one per line, BOS first (instead of sampling)");
  app.add_option("--texts", f.texts, "texts sampled from the model")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the first sampled text (text i: seed + i)")
      ->capture_default_str();
  app.add_option("--temperature", f.temperature, "sampling temperature")->capture_default_str();
  app.add_option("--prefill", f.prefill, "tokens prefilled before compression")
      ->capture_default_str();
  app.add_option("--continuation", f.continuation, "tokens teacher-forced after compression")
      ->capture_default_str();
  app.add_option("--budgets", f.budgets, "fractions of the prefill kept, e.g. 0.5,0.25")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--methods", f.methods,
                 "methods to run (default: all; centroidkv+outliers needs outlier heads; "
                 "streamingllm/h2o/snapkv+outliers keep the same heads whole; h2o/snapkv+merge "
                 "merge what they evict, also with +outliers; centroidkv+snapkv[@SHARE]: SnapKV's "
                 "window scores as a scored job with one budget over layers x heads)")
      ->delimiter(',');
  cli::AddPresetFlag(&app, &f.compression, &f.preset);
  cli::AddCompressOptionFlags(&app, &f.compression,
                              {.targets = false, .passthrough_heads = false,
                               .assignment = false, .output_layout = false});
  app.add_option("--passthrough-heads", f.passthrough_heads,
                 "outlier heads per layer, \"LAYER:H,H;LAYER:H\" (or \"H,H\" for every layer)");
  app.add_option("--outliers-share-budget", f.outliers_share_budget,
                 "outlier heads count against the budget (other heads shrink)")
      ->capture_default_str();
  app.add_option(
         "--calibration-texts", f.calibration_texts,
         "calibrate outlier heads on this many texts (seeds --calibration-seed + i; 0: none)")
      ->capture_default_str();
  app.add_option("--calibration-seed", f.calibration_seed, "first calibration seed")
      ->capture_default_str();
  app.add_option("--outlier-heads", f.outlier_heads, "heads the calibration picks")
      ->capture_default_str();
  app.add_option("--calibration-budget", f.calibration_budget,
                 "budget of the calibration (default: the smallest of --budgets)");
  app.add_flag("--calibrate-only", f.calibrate_only,
               "print the calibrated --passthrough-heads and exit");
  app.add_option("--kmeans-iterations", f.kmeans_iterations, "Lloyd iterations of k-means")
      ->capture_default_str();
  app.add_option("--merge-min-similarity", f.merge_min_similarity,
                 "h2o/snapkv+merge: an evicted entry is merged only where its most similar "
                 "kept entry's key cosine is at least this (dropped below; -1: all merged)")
      ->capture_default_str();
  cli::AddBackendOption(&app, "--backend", &f.backend, "server backend");
  cli::AddDTypeOption(&app, "--output-dtype", &f.output_dtype,
                      "dtype of CentroidKV's centroids (float32, float16, bfloat16, fp8_e4m3, "
                      "fp8_e5m2); the cache holds them widened");
  app.add_option("--output-scales", f.output_scales,
                 "fp8 results: a static scale for keys and values, one or one per KV head "
                 "(default: per-head dynamic scales)")
      ->delimiter(',');
  app.add_option("--report-md", f.report_md, "markdown report (\"\" for none)")
      ->capture_default_str();
  app.add_option("--report-json", f.report_json,
                 "results for scripts/plot_quality.py (\"\" for none)")
      ->capture_default_str();
  app.add_flag("--quiet", f.quiet, "no progress on stderr");
  app.add_flag("--online", f.online,
               "long-generation mode: online compression at fixed budgets "
               "(--budgets: fractions of --online-length) while teacher-forcing each text");
  app.add_option("--online-prompt", f.online_prompt, "online mode: prompt tokens")
      ->capture_default_str();
  app.add_option("--online-length", f.online_length,
                 "online mode: tokens per text, prompt included (0: the model's context)")
      ->capture_default_str();
  app.add_option("--online-report-md", f.online_report_md, "online mode: markdown report")
      ->capture_default_str();
  app.add_option("--online-report-json", f.online_report_json, "online mode: JSON results")
      ->capture_default_str();
}

std::string CommandLine(int argc, char** argv) {
  std::vector<std::string> words;
  for (int i = 0; i < argc; ++i) {
    std::string word = argv[i];
    if (word.find_first_of(" ;\"'$&|<>*?") != std::string::npos)
      word = absl::StrCat("'", word, "'");
    words.push_back(word);
  }
  return absl::StrJoin(words, " ");
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  if (path.empty()) return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

MethodSettings ToMethodSettings(const Flags& f) {
  MethodSettings s;
  s.centroidkv.compression = f.compression;
  s.centroidkv.backend = f.backend;
  s.centroidkv.output_dtype = f.output_dtype;
  s.centroidkv.compression.result_key_scales = f.output_scales;
  s.centroidkv.compression.result_value_scales = f.output_scales;
  s.outliers_share_budget = f.outliers_share_budget;
  s.kmeans_iterations = f.kmeans_iterations;
  s.merge_min_similarity = f.merge_min_similarity;
  return s;
}

// Calibrates outlier heads on sampled texts of other seeds; fills the context.
absl::Status Calibrate(const Flags& f, Transformer& transformer, client::Client& client,
                       RunSettings* settings, ReportContext* context) {
  const double budget = f.calibration_budget > 0.0
                            ? f.calibration_budget
                            : *std::min_element(f.budgets.begin(), f.budgets.end());
  CKV_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> texts,
                       SampleTexts(transformer, f.calibration_texts, f.prefill + f.continuation,
                                   f.temperature, f.calibration_seed));
  std::vector<PrefilledText> prefilled;
  for (const std::vector<int32_t>& text : texts) {
    CKV_ASSIGN_OR_RETURN(PrefilledText p, PrefillText(transformer, text, f.prefill, {}));
    prefilled.push_back(std::move(p));
  }
  CKV_ASSIGN_OR_RETURN(
      const std::vector<HeadScore> scores,
      ScoreHeads(transformer, client, prefilled, settings->method_settings, budget));
  const ModelConfig& config = transformer.model().config();
  const int32_t count = std::min<int32_t>(f.outlier_heads, static_cast<int32_t>(scores.size()));
  std::vector<std::pair<int32_t, int32_t>> ranked;
  for (int32_t i = 0; i < count; ++i) ranked.emplace_back(scores[i].layer, scores[i].head);
  settings->method_settings.outlier_ranking = ranked;
  settings->method_settings.outlier_heads = PickOutlierHeads(scores, count, config.n_layers);
  context->head_scores = scores;
  context->outlier_heads = FormatHeads(settings->method_settings.outlier_heads);
  context->outlier_source = absl::StrFormat(
      "Calibrated on %d texts sampled with seeds %d..%d (the evaluation uses other seeds), "
      "each KV head compressed alone to a %g budget; the %d most harmful heads were ranked.%s",
      f.calibration_texts, f.calibration_seed, f.calibration_seed + f.calibration_texts - 1, budget,
      count,
      f.outliers_share_budget
          ? " They share the budget (the other heads shrink), so each compression passes "
            "through the longest prefix of that ranking its budget can afford at its length, "
            "none where not one fits (then it equals centroidkv)."
          : "");
  return absl::OkStatus();
}

absl::Status CheckFlags(const Flags& f, const ModelConfig& config) {
  if (f.prefill < 1 || f.continuation < 1 || f.prefill + f.continuation > config.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefill ", f.prefill, " and --continuation ", f.continuation,
                     " must be positive and fit the model's context of ", config.seq_len));
  }
  for (double budget : f.budgets) {
    if (!(budget > 0.0 && budget <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--budgets: ", budget, " is not in (0, 1]"));
    }
  }
  if (f.budgets.empty()) return absl::InvalidArgumentError("--budgets is empty");
  if (f.tokens_file.empty() && f.texts < 1) return absl::InvalidArgumentError("--texts < 1");
  return absl::OkStatus();
}

// The evaluation texts: --tokens-file, or sampled with seeds --seed + i.
absl::StatusOr<std::vector<std::vector<int32_t>>> LoadTexts(const Flags& f,
                                                            Transformer& transformer,
                                                            ReportContext* context) {
  const int32_t length = f.prefill + f.continuation;
  if (!f.tokens_file.empty()) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> texts =
        ReadTokensFile(f.tokens_file, transformer.model().config().vocab_size, length);
    if (texts.ok()) {
      context->texts = absl::StrCat(texts->size(), " texts from `", f.tokens_file, "`");
    }
    return texts;
  }
  context->texts = absl::StrFormat(
      "%d texts of %d tokens sampled from the model at temperature %g, BOS/EOS suppressed, "
      "seeds %d..%d",
      f.texts, length, f.temperature, f.seed, f.seed + f.texts - 1);
  return SampleTexts(transformer, f.texts, length, f.temperature, f.seed);
}

// --methods, or every method (centroidkv+outliers only when there are outlier heads).
std::vector<std::string> ChooseMethods(const Flags& f, const MethodSettings& settings) {
  if (!f.methods.empty()) return f.methods;
  std::vector<std::string> methods;
  for (const std::string& m : AllMethods()) {
    if (!KeepsOutlierHeads(m) || CountHeads(settings.outlier_heads) > 0) methods.push_back(m);
  }
  return methods;
}

absl::Status WriteResults(const Flags& f, const std::vector<MethodResult>& results,
                          const ReportContext& context) {
  const std::string json = JsonLine(results);
  if (absl::Status s = WriteFile(f.report_md, MarkdownReport(results, context)); !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFile(f.report_json, json + "\n"); !s.ok()) return s;
  if (!f.quiet) {
    for (const MethodResult& r : results) {
      std::cerr << absl::StrFormat("%-20s budget %-5g kept %6.2f%%  mean KL %.5f  top-1 %.4f%s\n",
                                   r.method, r.budget, 100.0 * r.kv_fraction(),
                                   r.agreement.mean_kl(), r.agreement.top1(),
                                   r.targets.layers_missed == 0
                                       ? ""
                                       : absl::StrFormat("  target missed in %d of %d layers",
                                                         r.targets.layers_missed,
                                                         r.targets.layers));
    }
  }
  std::cout << json << std::endl;  // last: the one JSON line
  return absl::OkStatus();
}

// Outlier heads from --passthrough-heads, or calibrated when --calibration-texts > 0.
absl::Status ResolveOutliers(const Flags& f, Transformer& transformer, client::Client& client,
                             RunSettings* settings, ReportContext* context) {
  const ModelConfig& config = transformer.model().config();
  if (!f.passthrough_heads.empty()) {
    absl::StatusOr<std::vector<std::vector<int32_t>>> heads =
        ParseHeads(f.passthrough_heads, config.n_layers, config.n_kv_heads);
    if (!heads.ok()) return heads.status();
    settings->method_settings.outlier_heads = *heads;
    context->outlier_heads = FormatHeads(*heads);
    context->outlier_source = "Given with --passthrough-heads.";
    return absl::OkStatus();
  }
  const bool wanted =
      f.calibrate_only || f.methods.empty() ||
      std::any_of(f.methods.begin(), f.methods.end(), KeepsOutlierHeads);
  if (f.calibration_texts <= 0 || !wanted) return absl::OkStatus();
  if (f.tokens_file.empty() && f.seed < f.calibration_seed + f.calibration_texts &&
      f.calibration_seed < f.seed + f.texts) {
    std::cerr << "warning: the evaluation seeds overlap the calibration seeds\n";
  }
  if (!f.quiet) std::cerr << "calibrating outlier heads on " << f.calibration_texts << " texts\n";
  CKV_RETURN_IF_ERROR(Calibrate(f, transformer, client, settings, context));
  if (!f.quiet) std::cerr << "outlier heads: " << context->outlier_heads << "\n";
  return absl::OkStatus();
}

// --online: the long-generation report (docs/results/quality-online.md).
absl::Status RunOnlineMode(const Flags& f, const std::string& command, Transformer& transformer,
                           client::Client& client, const std::string& backend) {
  const ModelConfig& config = transformer.model().config();
  const int32_t length = f.online_length > 0 ? f.online_length : config.seq_len;
  if (length > config.seq_len || f.online_prompt < 1 || f.online_prompt >= length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--online-length ", length, " must fit the model's context of ", config.seq_len,
        " and exceed --online-prompt ", f.online_prompt));
  }
  CKV_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> texts,
                       SampleTexts(transformer, f.texts, length, f.temperature, f.seed));
  OnlineReportSettings settings;
  settings.budgets = f.budgets;
  OnlineSettings& o = settings.online;
  o.prompt_tokens = f.online_prompt;
  o.sink_tokens = f.compression.sink_tokens;
  o.recent_tokens = f.compression.recent_tokens;
  o.chunk_tokens = f.compression.chunk_size;
  o.compression = f.compression;
  o.backend = f.backend;
  Progress progress = nullptr;
  if (!f.quiet) progress = [](const std::string& line) { std::cerr << line << "\n"; };
  CKV_ASSIGN_OR_RETURN(const std::vector<OnlineMethodResult> results,
                       RunOnlineReport(transformer, &client, texts, settings, progress));
  const std::string context = absl::StrFormat(
      "Generated by `centroidkv-quality --online` (worker/quality/online_report.cc). Each text: "
      "prefill a %d-token prompt, then teacher-force the remaining %d tokens one by one while "
      "each method keeps every KV head at its budget of rows; every step's next-token "
      "distribution is compared with the uncompressed run's.\n\n"
      "- model: `%s` (%d layers, %d KV heads of size %d, context %d: the texts are %d tokens, "
      "the whole context; a longer-context model would allow longer generations)\n"
      "- texts: %d sampled from the model at temperature %g, seeds %d..%d\n"
      "- budgets: fractions of the text length, in rows per KV head; sinks %d and recent %d "
      "protected by every method\n"
      "- CentroidKV: `client::Sequence`, fixed-budget policy, chunks of %d positions, engine "
      "chunk %d, max passes %d, backend `%s`, through a server on this machine; "
      "*pipelined* applies each splice when it has arrived (the step never waits), *waits "
      "every step* flushes the sequence after each token (deterministic; the step pays the "
      "round trip)\n"
      "- rows per head: attended rows averaged over steps and heads / the most any head held "
      "after a step (pipelined rows stay uncompressed until their splice lands) / at the end "
      "with every splice applied\n"
      "- step latency: forward pass plus the method's own work, medians and p99 over every "
      "generated step of every text; methods alternate within each text, so they share the "
      "machine's load (2 vCPUs shared with other builds: compare ratios, not absolutes)\n\n"
      "Regenerate with `scripts/quality.sh --online --texts %d` (builds, starts a server on a "
      "unix socket, runs the command below):\n\n```sh\n%s\n```",
      f.online_prompt, length - f.online_prompt, f.model, config.n_layers, config.n_kv_heads,
      config.head_size(), config.seq_len, length, f.texts, f.temperature, f.seed,
      f.seed + f.texts - 1, f.compression.sink_tokens, f.compression.recent_tokens,
      f.compression.chunk_size, f.compression.chunk_size, f.compression.max_passes, backend,
      f.texts, command);
  CKV_RETURN_IF_ERROR(WriteFile(f.online_report_md, OnlineMarkdownReport(results, context)));
  const std::string json = OnlineJsonLine(results);
  CKV_RETURN_IF_ERROR(WriteFile(f.online_report_json, json + "\n"));
  std::cout << json << std::endl;
  return absl::OkStatus();
}

absl::Status Run(const Flags& f, const std::string& command) {
  CKV_ASSIGN_OR_RETURN(const Model model, LoadModel(f.model));
  const ModelConfig& config = model.config();
  if (!f.online) CKV_RETURN_IF_ERROR(CheckFlags(f, config));
  CKV_ASSIGN_OR_RETURN(const Tokenizer tokenizer, LoadTokenizer(f.tokenizer, config.vocab_size));
  Transformer transformer(model);
  RunSettings settings;
  settings.prefill = f.prefill;
  settings.continuation = f.continuation;
  settings.budgets = f.budgets;
  settings.method_settings = ToMethodSettings(f);
  ReportContext context;
  context.command = command;
  context.preset = cli::DescribePreset(f.preset, f.compression);
  std::fprintf(stderr, "centroidkv-quality: preset %s\n", context.preset.c_str());
  if (f.compression.chunk_size > f.prefill) {
    std::fprintf(stderr,
                 "centroidkv-quality: warning: --chunk-size %d is larger than the prefill (%d "
                 "tokens): every head is one chunk (the small-model preset has chunk %d)\n",
                 f.compression.chunk_size, f.prefill, kSmallModelPreset.chunk_size);
  }
  context.head_size = config.head_size();
  context.model =
      absl::StrFormat("`%s` (%d layers, %d KV heads of size %d, %d query heads, %d parameters)",
                      f.model, config.n_layers, config.n_kv_heads, config.head_size(),
                      config.n_heads, model.ParameterCount());
  client::ClientOptions client_options;
  client_options.target = f.server;
  client::ApplySecurityFlags(f.security, &client_options);
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                       client::ConnectTarget(client_options));
  CKV_ASSIGN_OR_RETURN(const client::ServerInfo info, client->GetInfo());
  context.backend = f.backend == BackendKind::kAuto ? info.default_backend
                                                    : std::string(BackendKindName(f.backend));
  if (f.output_dtype != DType::kFloat32) {
    context.backend += absl::StrCat(
        ", centroids returned as ", std::string(DTypeName(f.output_dtype)),
        !IsFp8(f.output_dtype) ? ""
        : f.output_scales.empty()
            ? " (per-head dynamic scales)"
            : absl::StrCat(" (static scale ", absl::StrJoin(f.output_scales, ","), ")"));
  }
  if (f.online) return RunOnlineMode(f, command, transformer, *client, context.backend);
  CKV_RETURN_IF_ERROR(ResolveOutliers(f, transformer, *client, &settings, &context));
  if (f.calibrate_only) {
    for (const HeadScore& score : context.head_scores) {
      std::cerr << absl::StrFormat("layer %d head %d alone: mean KL %.5f top-1 %.4f\n", score.layer,
                                   score.head, score.agreement.mean_kl(), score.agreement.top1());
    }
    std::cout << "--passthrough-heads=" << context.outlier_heads << "\n";
    return absl::OkStatus();
  }
  settings.methods = ChooseMethods(f, settings.method_settings);
  CKV_ASSIGN_OR_RETURN(const std::vector<std::vector<int32_t>> texts,
                       LoadTexts(f, transformer, &context));
  const std::vector<int32_t>& first = texts.front();
  context.sample =
      absl::StrReplaceAll(tokenizer.Decode(std::vector<int32_t>(
                              first.begin(), first.begin() + std::min<size_t>(first.size(), 48))),
                          {{"\n", " "}, {"|", "/"}});
  context.settings = settings;
  Progress progress = nullptr;
  if (!f.quiet) progress = [](const std::string& line) { std::cerr << line << "\n"; };
  CKV_ASSIGN_OR_RETURN(const std::vector<MethodResult> results,
                       RunQuality(transformer, client.get(), texts, settings, progress));
  return WriteResults(f, results, context);
}

}  // namespace
}  // namespace centroidkv::worker::quality

int main(int argc, char** argv) {
  CLI::App app{
      "CentroidKV quality report (SPEC section 4): CentroidKV through a running server "
      "vs StreamingLLM, H2O-style eviction and k-means on a llama2.c model"};
  centroidkv::worker::quality::Flags flags;
  centroidkv::worker::quality::AddFlags(app, flags);
  CLI11_PARSE(app, argc, argv);
  const absl::Status status =
      centroidkv::worker::quality::Run(flags, centroidkv::worker::quality::CommandLine(argc, argv));
  if (!status.ok()) {
    std::cerr << "centroidkv-quality: " << status << "\n";
    return 1;
  }
  return 0;
}
