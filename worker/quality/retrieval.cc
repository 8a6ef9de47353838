// The retrieval loop: cases x (full, budgets x methods), exact match of greedy answers.
#include "worker/quality/retrieval.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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
  const bool track_attention =
      std::find(settings.methods.begin(), settings.methods.end(), kH2o) != settings.methods.end();
  std::map<std::tuple<size_t, std::string, double>, RetrievalCell> cells;
  for (size_t i = 0; i < cases.size(); ++i) {
    const RetrievalCase& c = cases[i];
    KvCache prefilled = transformer.NewCache();
    prefilled.TrackAttention(track_attention);
    if (absl::Status status = transformer.Prefill(c.context, &prefilled); !status.ok()) {
      return status;
    }
    std::string line = absl::StrFormat("case %d/%d %s@%.2f:", i + 1, cases.size(), c.kind, c.depth);
    for (size_t m = 0; m < methods.size(); ++m) {
      KvCache cache = prefilled;
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
      RetrievalCell& cell = cells[{m, c.kind, c.depth}];
      cell.method = methods[m].name;
      cell.budget = methods[m].budget;
      cell.kind = c.kind;
      cell.depth = c.depth;
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
  for (const RetrievalCell& c : cells) {
    if (std::find(rows.begin(), rows.end(), std::make_pair(c.budget, c.method)) == rows.end()) {
      rows.emplace_back(c.budget, c.method);
    }
    if (std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end()) kinds.push_back(c.kind);
    depth_set.insert(c.depth);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  auto tally = [&cells](const std::pair<double, std::string>& row, const std::string* kind,
                        const double* depth) {
    Tally t;
    for (const RetrievalCell& c : cells) {
      if (c.budget == row.first && c.method == row.second && (!kind || c.kind == *kind) &&
          (!depth || c.depth == *depth)) {
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
  return md;
}

std::string RetrievalJson(const std::vector<RetrievalCell>& cells) {
  std::string json = "[";
  for (size_t i = 0; i < cells.size(); ++i) {
    const RetrievalCell& c = cells[i];
    absl::StrAppend(
        &json, i ? "," : "",
        absl::StrFormat("{\"method\":\"%s\",\"budget\":%g,\"kind\":\"%s\",\"depth\":%g,"
                        "\"hits\":%d,\"cases\":%d,\"kv_kept\":%.6f}",
                        c.method, c.budget, c.kind, c.depth, c.hits, c.cases,
                        c.entries_full ? static_cast<double>(c.entries_kept) / c.entries_full : 0.0));
  }
  return json + "]";
}

}  // namespace centroidkv::worker::quality
