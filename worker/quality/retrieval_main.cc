// centroidkv-retrieval: the retrieval evaluation of the long-context model (issue 22,
// worker/quality/retrieval.h) — pass key, multi-key and variable-tracking cases with the
// deciding fact at several depths, the context compressed before the question, greedy
// answers, exact match per method, budget and depth. CentroidKV goes through a running
// server (as in centroidkv-quality); StreamingLLM, H2O and k-means run in-process.
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
#include "centroidkv/client/client.h"
#include "centroidkv/client/replica_pool.h"
#include "centroidkv/common/status_macros.h"
#include "client/cli/kind_flags.h"
#include "client/cli/security_flags.h"
#include "worker/model.h"
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
  std::vector<std::string> methods = {kCentroidKv, kStreamingLlm, kH2o};
  int32_t chunk_size = 32;
  int32_t sink_tokens = 4;
  int32_t recent_tokens = 32;
  BackendKind backend = BackendKind::kAuto;
  std::string report_md;
  bool quiet = false;
};

absl::Status Run(const Flags& f) {
  CKV_ASSIGN_OR_RETURN(const Model model, LoadModel(f.model));
  CKV_ASSIGN_OR_RETURN(
      const std::vector<RetrievalCase> cases,
      ReadRetrievalCases(f.cases, model.config().vocab_size, model.config().seq_len));
  for (double budget : f.budgets) {
    if (!(budget > 0.0 && budget <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--budgets: ", budget, " is not in (0, 1]"));
    }
  }
  RetrievalSettings settings;
  settings.budgets = f.budgets;
  settings.methods = f.methods;
  CompressOptions& c = settings.method_settings.centroidkv.compression;
  c.chunk_size = f.chunk_size;
  c.sink_tokens = f.sink_tokens;
  c.recent_tokens = f.recent_tokens;
  settings.method_settings.centroidkv.backend = f.backend;
  std::unique_ptr<client::Client> client;
  if (std::find(f.methods.begin(), f.methods.end(), kCentroidKv) != f.methods.end()) {
    client::ClientOptions options;
    options.target = f.server;
    client::ApplySecurityFlags(f.security, &options);
    CKV_ASSIGN_OR_RETURN(client, client::ConnectTarget(options));
  }
  Transformer transformer(model);
  std::function<void(const std::string&)> progress;
  if (!f.quiet) progress = [](const std::string& line) { std::cerr << line << "\n"; };
  CKV_ASSIGN_OR_RETURN(const std::vector<RetrievalCell> cells,
                       RunRetrieval(transformer, client.get(), cases, settings, progress));
  const std::string md = RetrievalMarkdown(cells);
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
  app.add_option("--methods", f.methods, "centroidkv, streamingllm, h2o, kmeans")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--chunk-size", f.chunk_size, "SPEC chunk_size C")->capture_default_str();
  app.add_option("--sink-tokens", f.sink_tokens, "SPEC sink_tokens S (also the baselines')")
      ->capture_default_str();
  app.add_option("--recent-tokens", f.recent_tokens, "SPEC recent_tokens W (also the baselines')")
      ->capture_default_str();
  centroidkv::cli::AddBackendOption(&app, "--backend", &f.backend, "server backend");
  app.add_option("--report-md", f.report_md, "markdown table (\"\": none)");
  app.add_flag("--quiet", f.quiet, "no progress on stderr");
  CLI11_PARSE(app, argc, argv);
  const absl::Status status = q::Run(f);
  if (!status.ok()) {
    std::cerr << "centroidkv-retrieval: " << status << "\n";
    return 1;
  }
  return 0;
}
