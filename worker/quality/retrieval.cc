// The retrieval loop: cases x (full, budgets x methods), exact match of greedy answers.
#include "worker/quality/retrieval.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "centroidkv/common/status_macros.h"
#include "worker/compress_cache.h"
#include "worker/quality/calibration.h"
#include "worker/sampler.h"
#include "worker/tokenizer.h"

namespace centroidkv::worker::quality {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view field, int32_t vocab_size,
                                              const std::string& where) {
  std::vector<int32_t> ids;
  for (absl::string_view word : absl::StrSplit(field, ' ', absl::SkipEmpty())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(word, &id) || id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", word,
                                                     "\" is not a token id in [0, ", vocab_size,
                                                     ")"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

int32_t RetrievalCase::length_class() const {
  const size_t tokens = context.size() + question.size() + answer.size();
  int32_t length = 1;
  while (static_cast<size_t>(length) < tokens) length *= 2;
  return length;
}

absl::StatusOr<std::vector<RetrievalCase>> ReadRetrievalCases(const std::string& path,
                                                              int32_t vocab_size,
                                                              int32_t max_length) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::vector<RetrievalCase> cases;
  std::string line;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, " line ", line_number);
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '|');
    if (fields.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected \"KIND DEPTH | context | question | answer\""));
    }
    const std::vector<absl::string_view> head =
        absl::StrSplit(fields[0], ' ', absl::SkipEmpty());
    RetrievalCase c;
    if (head.size() != 2 || !absl::SimpleAtod(head[1], &c.depth)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": bad \"KIND DEPTH\""));
    }
    c.kind = std::string(head[0]);
    absl::StatusOr<std::vector<int32_t>> context = ParseIds(fields[1], vocab_size, where);
    absl::StatusOr<std::vector<int32_t>> question = ParseIds(fields[2], vocab_size, where);
    absl::StatusOr<std::vector<int32_t>> answer = ParseIds(fields[3], vocab_size, where);
    for (const auto* ids : {&context, &question, &answer}) {
      if (!ids->ok()) return ids->status();
    }
    c.context = *std::move(context);
    c.question = *std::move(question);
    c.answer = *std::move(answer);
    if (c.context.empty() || c.context.front() != kBosToken) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the context must start with BOS"));
    }
    if (c.question.empty() || c.answer.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty question or answer"));
    }
    const size_t length = c.context.size() + c.question.size() + c.answer.size() - 1;
    if (length > static_cast<size_t>(max_length)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", length,
                                                     " positions exceed the model's context of ",
                                                     max_length));
    }
    cases.push_back(std::move(c));
  }
  if (cases.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no cases"));
  return cases;
}

absl::StatusOr<std::vector<int32_t>> AnswerGreedily(Transformer& transformer,
                                                    const std::vector<int32_t>& question,
                                                    size_t answer_length, KvCache* cache) {
  for (int32_t token : question) {
    if (absl::Status status = transformer.Forward(token, cache); !status.ok()) return status;
  }
  std::vector<int32_t> answer;
  while (answer.size() < answer_length) {
    answer.push_back(Argmax(transformer.logits()));
    if (answer.size() == answer_length) break;
    if (absl::Status status = transformer.Forward(answer.back(), cache); !status.ok()) {
      return status;
    }
  }
  return answer;
}

absl::StatusOr<double> AnswerNll(Transformer& transformer, const std::vector<int32_t>& question,
                                 const std::vector<int32_t>& answer, KvCache* cache) {
  for (int32_t token : question) {
    if (absl::Status status = transformer.Forward(token, cache); !status.ok()) return status;
  }
  double nll = 0.0;
  for (size_t i = 0; i < answer.size(); ++i) {
    const std::vector<float>& logits = transformer.logits();
    const double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
    nll += max + std::log(sum) - logits[static_cast<size_t>(answer[i])];
    if (i + 1 < answer.size()) {
      if (absl::Status status = transformer.Forward(answer[i], cache); !status.ok()) return status;
    }
  }
  return nll;
}

absl::StatusOr<std::vector<HeadRetrievalScore>> ScoreHeadsOnCases(
    Transformer& transformer, client::Client& client, const std::vector<RetrievalCase>& cases,
    const MethodSettings& settings, double budget) {
  const ModelConfig& config = transformer.model().config();
  std::vector<HeadRetrievalScore> scores;
  for (int32_t layer = 0; layer < config.n_layers; ++layer) {
    for (int32_t head = 0; head < config.n_kv_heads; ++head) {
      scores.push_back({layer, head, 0.0, 0, 0});
    }
  }
  for (const RetrievalCase& c : cases) {
    KvCache prefilled = transformer.NewCache();
    if (absl::Status status = transformer.Prefill(c.context, &prefilled); !status.ok()) {
      return status;
    }
    for (HeadRetrievalScore& score : scores) {
      const CompressCacheOptions options = CentroidKvOptions(
          settings, budget, AllHeadsBut(score.layer, score.head, config.n_layers, config.n_kv_heads),
          /*share_budget=*/false, config.n_layers, config.n_kv_heads, prefilled.head(0, 0).size());
      KvCache cache = prefilled;
      if (absl::Status status = CompressCache(client, options, &cache).status(); !status.ok()) {
        return status;
      }
      KvCache greedy = cache;
      CKV_ASSIGN_OR_RETURN(const double nll, AnswerNll(transformer, c.question, c.answer, &cache));
      CKV_ASSIGN_OR_RETURN(const std::vector<int32_t> answer,
                           AnswerGreedily(transformer, c.question, c.answer.size(), &greedy));
      score.answer_nll += nll;
      score.hits += answer == c.answer;
      score.cases += 1;
    }
  }
  std::stable_sort(scores.begin(), scores.end(),
                   [](const HeadRetrievalScore& a, const HeadRetrievalScore& b) {
                     return a.answer_nll > b.answer_nll;
                   });
  return scores;
}

absl::StatusOr<std::vector<RetrievalCell>> RunRetrieval(
    Transformer& transformer, client::Client* client, const std::vector<RetrievalCase>& cases,
    const RetrievalSettings& settings, const std::function<void(const std::string&)>& progress) {
  struct Method {
    std::string name;
    double budget;
    CacheCompressor compress;  // empty for the full cache
  };
  std::vector<Method> methods = {{kFullCache, 1.0, nullptr}};
  for (double budget : settings.budgets) {
    for (const std::string& name : settings.methods) {
      absl::StatusOr<CacheCompressor> compress =
          MakeCompressor(name, budget, settings.method_settings, client);
      if (!compress.ok()) return compress.status();
      methods.push_back({name, budget, *std::move(compress)});
    }
  }
  const PrefillTracking tracking = TrackingFor(settings.methods, settings.method_settings);
  std::map<std::tuple<size_t, std::string, double, int32_t>, RetrievalCell> cells;
  for (size_t i = 0; i < cases.size(); ++i) {
    const RetrievalCase& c = cases[i];
    KvCache prefilled = transformer.NewCache();
    std::optional<KvCache> window_cache;
    if (absl::Status status =
            PrefillTracked(transformer, c.context, tracking, &prefilled, &window_cache);
        !status.ok()) {
      return status;
    }
    std::string line = absl::StrFormat("case %d/%d %s@%.2f:", i + 1, cases.size(), c.kind, c.depth);
    for (size_t m = 0; m < methods.size(); ++m) {
      KvCache cache = UsesObservationWindow(methods[m].name) ? *window_cache : prefilled;
      if (methods[m].compress) {
        if (absl::Status status = methods[m].compress(&cache); !status.ok()) {
          return absl::Status(status.code(),
                              absl::StrCat(methods[m].name, " at budget ", methods[m].budget,
                                           ", case ", i, ": ", status.message()));
        }
      }
      const int64_t kept = cache.TotalEntries();
      absl::StatusOr<std::vector<int32_t>> answer =
          AnswerGreedily(transformer, c.question, c.answer.size(), &cache);
      if (!answer.ok()) return answer.status();
      const bool hit = *answer == c.answer;
      RetrievalCell& cell = cells[{m, c.kind, c.depth, c.length_class()}];
      cell.method = methods[m].name;
      cell.budget = methods[m].budget;
      cell.kind = c.kind;
      cell.depth = c.depth;
      cell.length = c.length_class();
      cell.hits += hit;
      cell.cases += 1;
      cell.entries_kept += kept;
      cell.entries_full += prefilled.TotalEntries();
      absl::StrAppend(&line, " ", methods[m].name, "@", methods[m].budget, "=", hit ? "1" : "0");
    }
    if (progress) progress(line);
  }
  std::vector<RetrievalCell> out;
  for (auto& [key, cell] : cells) out.push_back(std::move(cell));
  return out;
}

namespace {

struct Tally {
  int64_t hits = 0, cases = 0, kept = 0, full = 0;
  void Add(const RetrievalCell& c) {
    hits += c.hits;
    cases += c.cases;
    kept += c.entries_kept;
    full += c.entries_full;
  }
  std::string Accuracy() const {
    return cases == 0 ? "-" : absl::StrFormat("%.3f", static_cast<double>(hits) / cases);
  }
};

}  // namespace

std::string RetrievalMarkdown(const std::vector<RetrievalCell>& cells) {
  std::vector<std::pair<double, std::string>> rows;  // (budget descending, method) in order
  std::vector<std::string> kinds;
  std::set<double> depth_set;
  std::set<int32_t> length_set;
  for (const RetrievalCell& c : cells) {
    length_set.insert(c.length);
    if (std::find(rows.begin(), rows.end(), std::make_pair(c.budget, c.method)) == rows.end()) {
      rows.emplace_back(c.budget, c.method);
    }
    if (std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end()) kinds.push_back(c.kind);
    depth_set.insert(c.depth);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  auto tally = [&cells](const std::pair<double, std::string>& row, const std::string* kind,
                        const double* depth, const int32_t* length = nullptr) {
    Tally t;
    for (const RetrievalCell& c : cells) {
      if (c.budget == row.first && c.method == row.second && (!kind || c.kind == *kind) &&
          (!depth || c.depth == *depth) && (!length || c.length == *length)) {
        t.Add(c);
      }
    }
    return t;
  };
  std::string md = "| budget | method | KV kept | exact match (all) |";
  std::string rule = "| ---: | --- | ---: | ---: |";
  for (const std::string& k : kinds) {
    absl::StrAppend(&md, " ", k, " |");
    absl::StrAppend(&rule, " ---: |");
  }
  absl::StrAppend(&md, "\n", rule, "\n");
  for (const auto& row : rows) {
    const Tally all = tally(row, nullptr, nullptr);
    absl::StrAppend(&md, absl::StrFormat("| %.0f%% | %s | %.1f%% | %s (%d/%d) |", 100 * row.first,
                                         row.second,
                                         all.full ? 100.0 * all.kept / all.full : 0.0,
                                         all.Accuracy(), all.hits, all.cases));
    for (const std::string& k : kinds) absl::StrAppend(&md, " ", tally(row, &k, nullptr).Accuracy(), " |");
    absl::StrAppend(&md, "\n");
  }
  absl::StrAppend(&md, "\nExact match by depth of the deciding fact (all kinds):\n\n| budget | method |");
  rule = "| ---: | --- |";
  for (double d : depth_set) {
    absl::StrAppend(&md, absl::StrFormat(" %.0f%% |", 100 * d));
    absl::StrAppend(&rule, " ---: |");
  }
  absl::StrAppend(&md, "\n", rule, "\n");
  for (const auto& row : rows) {
    absl::StrAppend(&md, absl::StrFormat("| %.0f%% | %s |", 100 * row.first, row.second));
    for (double d : depth_set) absl::StrAppend(&md, " ", tally(row, nullptr, &d).Accuracy(), " |");
    absl::StrAppend(&md, "\n");
  }
  if (length_set.size() > 1) {
    absl::StrAppend(&md, "\nExact match by length of the case in tokens (all kinds and depths):\n\n"
                         "| budget | method |");
    rule = "| ---: | --- |";
    for (int32_t n : length_set) {
      absl::StrAppend(&md, " ", n, " |");
      absl::StrAppend(&rule, " ---: |");
    }
    absl::StrAppend(&md, "\n", rule, "\n");
    for (const auto& row : rows) {
      absl::StrAppend(&md, absl::StrFormat("| %.0f%% | %s |", 100 * row.first, row.second));
      for (int32_t n : length_set) {
        absl::StrAppend(&md, " ", tally(row, nullptr, nullptr, &n).Accuracy(), " |");
      }
      absl::StrAppend(&md, "\n");
    }
  }
  return md;
}

std::string RetrievalJson(const std::vector<RetrievalCell>& cells) {
  std::string json = "[";
  for (size_t i = 0; i < cells.size(); ++i) {
    const RetrievalCell& c = cells[i];
    absl::StrAppend(
        &json, i ? "," : "",
        absl::StrFormat("{\"method\":\"%s\",\"budget\":%g,\"kind\":\"%s\",\"depth\":%g,"
                        "\"length\":%d,\"hits\":%d,\"cases\":%d,\"kv_kept\":%.6f}",
                        c.method, c.budget, c.kind, c.depth, c.length, c.hits, c.cases,
                        c.entries_full ? static_cast<double>(c.entries_kept) / c.entries_full : 0.0));
  }
  return json + "]";
}

}  // namespace centroidkv::worker::quality
