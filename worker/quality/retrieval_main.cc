// centroidkv-retrieval: the retrieval evaluation of the long-context model
// (worker/quality/retrieval.h) — pass key, multi-key and variable-tracking cases with the
// deciding fact at several depths, the context compressed before the question, greedy
// answers, exact match per method, budget, depth and length. CentroidKV goes through a
// running server (as in centroidkv-quality); StreamingLLM, H2O, SnapKV and k-means run
// in-process. centroidkv+outliers passes through heads given by --outlier-heads or
// calibrated on --calibration-cases (other stories and seeds than the evaluation's).
// Writes a markdown table and prints last one JSON line of cells.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/common/status_macros.h"
#include "client/cli/compress_option_flags.h"
#include "client/cli/kind_flags.h"
#include "client/cli/security_flags.h"
#include "worker/model.h"
#include "worker/quality/calibration.h"
#include "worker/quality/retrieval.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {
namespace {

struct Flags {
  client::SecurityFlags security;
  std::string model = "models/longctx/model.bin";
  std::string cases = "models/longctx/retrieval_cases.txt";
  std::string server = "127.0.0.1:50051";
  std::vector<double> budgets = {0.5, 0.25, 0.1};
  std::vector<std::string> methods = {kCentroidKv, kStreamingLlm, kH2o, kSnapKv};
  std::string outlier_heads;      // "LAYER:HEAD,...;..." for centroidkv+outliers
  std::string calibration_cases;  // or calibrate them on these cases
  int32_t outliers = 2;
  double calibration_budget = 0.0;  // default: the smallest of --budgets
  // As centroidkv-quality's defaults; S and W are also the baselines' sinks and recent window.
  CompressOptions compression = kSmallModelPreset.Apply();
  std::string preset{kSmallModelPreset.name};
  BackendKind backend = BackendKind::kAuto;
  double merge_min_similarity = -1.0;
  std::string report_md;
  bool quiet = false;
};

absl::Status Run(const Flags& f, const std::string& command) {
  CKV_ASSIGN_OR_RETURN(const Model model, LoadModel(f.model));
  CKV_ASSIGN_OR_RETURN(
      const std::vector<RetrievalCase> cases,
      ReadRetrievalCases(f.cases, model.config().vocab_size, model.config().seq_len));
  for (double budget : f.budgets) {
    if (!(budget > 0.0 && budget <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--budgets: ", budget, " is not in (0, 1]"));
    }
  }
  std::cerr << "centroidkv-retrieval: preset "
            << centroidkv::cli::DescribePreset(f.preset, f.compression) << "\n";
  for (const RetrievalCase& c : cases) {
    if (f.compression.chunk_size > static_cast<int32_t>(c.context.size())) {
      std::cerr << "centroidkv-retrieval: warning: --chunk-size " << f.compression.chunk_size
                << " is larger than a case's context (" << c.context.size()
                << " tokens): its heads are one chunk\n";
      break;
    }
  }
  RetrievalSettings settings;
  settings.budgets = f.budgets;
  settings.methods = f.methods;
  settings.method_settings.centroidkv.compression = f.compression;
  settings.method_settings.centroidkv.backend = f.backend;
  settings.method_settings.merge_min_similarity = f.merge_min_similarity;
  const ModelConfig& config = model.config();
  if (!f.outlier_heads.empty()) {
    CKV_ASSIGN_OR_RETURN(settings.method_settings.outlier_heads,
                         ParseHeads(f.outlier_heads, config.n_layers, config.n_kv_heads));
  }
  const bool outliers_wanted = !f.outlier_heads.empty() || !f.calibration_cases.empty();
  if (outliers_wanted && std::find(settings.methods.begin(), settings.methods.end(),
                                   kCentroidKvOutliers) == settings.methods.end()) {
    settings.methods.insert(settings.methods.begin() + 1, kCentroidKvOutliers);
  }
  const bool needs_server = std::any_of(
      settings.methods.begin(), settings.methods.end(),
      [](const std::string& m) { return BaseMethod(m) == kCentroidKv; });
  std::unique_ptr<client::Client> client;
  if (needs_server) {
    client::ClientOptions options;
    options.target = f.server;
    client::ApplySecurityFlags(f.security, &options);
    CKV_ASSIGN_OR_RETURN(client, client::ConnectTarget(options));
  }
  Transformer transformer(model);
  std::function<void(const std::string&)> progress;
  if (!f.quiet) progress = [](const std::string& line) { std::cerr << line << "\n"; };
  std::string outlier_note;
  if (!f.calibration_cases.empty()) {
    CKV_ASSIGN_OR_RETURN(
        const std::vector<RetrievalCase> calibration,
        ReadRetrievalCases(f.calibration_cases, config.vocab_size, config.seq_len));
    const double budget = f.calibration_budget > 0.0
                              ? f.calibration_budget
                              : *std::min_element(f.budgets.begin(), f.budgets.end());
    CKV_ASSIGN_OR_RETURN(const std::vector<HeadRetrievalScore> scores,
                         ScoreHeadsOnCases(transformer, *client, calibration,
                                           settings.method_settings, budget));
    std::vector<std::pair<int32_t, int32_t>> ranked;
    std::string table = "| layer | KV head | answer NLL (nats, summed) | exact match |\n| ---: | ---: | ---: | ---: |\n";
    for (const HeadRetrievalScore& s : scores) {
      ranked.emplace_back(s.layer, s.head);
      absl::StrAppend(&table, absl::StrFormat("| %d | %d | %.2f | %d/%d |\n", s.layer, s.head,
                                              s.answer_nll, s.hits, s.cases));
    }
    ranked.resize(std::min<size_t>(ranked.size(), static_cast<size_t>(std::max(0, f.outliers))));
    settings.method_settings.outlier_ranking = ranked;
    outlier_note = absl::StrCat(
        absl::StrFormat("- outlier heads of centroidkv+outliers: the first of `%s` (most harmful "
                        "first), calibrated on `%s` (%d cases): each KV head compressed alone "
                        "to a %g budget, ranked by the log-likelihood its answers lost. They "
                        "share the budget (the other heads shrink), so each compression passes "
                        "through as many of them as its budget and length can afford, none "
                        "where not one fits (then it equals centroidkv)\n\n",
                        absl::StrJoin(ranked, ", ",
                                      [](std::string* out, const std::pair<int32_t, int32_t>& h) {
                                        absl::StrAppend(out, h.first, ":", h.second);
                                      }),
                        f.calibration_cases, calibration.size(), budget),
        table, "\n");
  } else if (!f.outlier_heads.empty()) {
    outlier_note = absl::StrFormat(
        "- outlier heads of centroidkv+outliers: `%s` (given); they share the budget\n",
        FormatHeads(settings.method_settings.outlier_heads));
  }
  CKV_ASSIGN_OR_RETURN(const std::vector<RetrievalCell> cells,
                       RunRetrieval(transformer, client.get(), cases, settings, progress));
  const std::string md = absl::StrCat(
      "# Retrieval under KV-cache compression (long-context model)\n\n"
      "Generated by `centroidkv-retrieval` (worker/quality/retrieval.h; `scripts/quality_long.sh`). "
      "Each case's context (",
      cases.front().context.size(),
      " tokens for the first case) is prefilled and compressed query-agnostically, before the "
      "question arrives; the question is then fed uncompressed and the answer decoded "
      "greedily; a case counts when every answer token matches. CentroidKV runs through the "
      "server, the baselines in-process; all protect the same sinks and recent window.\n\n",
      absl::StrFormat("- model: `%s` (%d layers, %d KV heads of size %d, %d query heads, "
                      "context %d)\n",
                      f.model, model.config().n_layers, model.config().n_kv_heads,
                      model.config().head_size(), model.config().n_heads,
                      model.config().seq_len),
      absl::StrFormat("- cases: `%s` (%d cases)\n", f.cases, cases.size()),
      "- preset: " + centroidkv::cli::DescribePreset(f.preset, f.compression) + "\n" +
      absl::StrFormat("- CentroidKV: chunk %d, sinks %d, recent %d; baselines protect the same "
                      "%d sinks and %d recent entries\n",
                      f.compression.chunk_size, f.compression.sink_tokens,
                      f.compression.recent_tokens, f.compression.sink_tokens,
                      f.compression.recent_tokens),
      outlier_note, "- command: `", command, "`\n\n", RetrievalMarkdown(cells));
  if (!f.report_md.empty()) {
    std::ofstream out(f.report_md);
    out << md;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat(f.report_md, ": cannot write"));
  }
  if (!f.quiet) std::cerr << md;
  std::cout << RetrievalJson(cells) << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace centroidkv::worker::quality

int main(int argc, char** argv) {
  namespace q = centroidkv::worker::quality;
  CLI::App app{"Retrieval under KV-cache compression: exact match of greedy answers after the "
               "context was compressed (CentroidKV through a running server vs eviction)"};
  q::Flags f;
  app.add_option("--model", f.model, "llama2.c checkpoint")->capture_default_str();
  app.add_option("--cases", f.cases, "cases file (models/longctx/retrieval_cases.py)")
      ->capture_default_str();
  app.add_option("--server", f.server, "CentroidKV server address")->capture_default_str();
  centroidkv::client::AddSecurityFlags(&app, &f.security);
  app.add_option("--budgets", f.budgets, "fractions of the context kept")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--methods", f.methods,
                 "centroidkv, centroidkv+outliers, streamingllm, h2o, snapkv, kmeans; "
                 "streamingllm+outliers, h2o+outliers, snapkv+outliers keep the same outlier "
                 "heads whole (the control); h2o+merge, snapkv+merge[+outliers] merge what "
                 "they evict into the most similar kept entries; centroidkv+snapkv[@SHARE] sends "
                 "SnapKV's window scores as a scored job, one budget over layers x heads")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--outlier-heads", f.outlier_heads,
                 "passthrough heads of centroidkv+outliers, \"LAYER:HEAD,...;...\"");
  app.add_option("--calibration-cases", f.calibration_cases,
                 "calibrate the outlier heads on these cases (their own stories and seed)");
  app.add_option("--outliers", f.outliers, "outlier heads the calibration picks")
      ->capture_default_str();
  app.add_option("--calibration-budget", f.calibration_budget,
                 "budget of the calibration (default: the smallest of --budgets)");
  centroidkv::cli::AddPresetFlag(&app, &f.compression, &f.preset);
  centroidkv::cli::AddCompressOptionFlags(&app, &f.compression,
                                          {.targets = false, .passthrough_heads = false,
                                           .assignment = false, .output_layout = false});
  centroidkv::cli::AddBackendOption(&app, "--backend", &f.backend, "server backend");
  app.add_option("--merge-min-similarity", f.merge_min_similarity,
                 "h2o/snapkv+merge: merge an evicted entry only at this key cosine or above")
      ->capture_default_str();
  app.add_option("--report-md", f.report_md, "markdown table (\"\": none)");
  app.add_flag("--quiet", f.quiet, "no progress on stderr");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> words(argv, argv + argc);
  const absl::Status status = q::Run(f, absl::StrJoin(words, " "));
  if (!status.ok()) {
    std::cerr << "centroidkv-retrieval: " << status << "\n";
    return 1;
  }
  return 0;
}
