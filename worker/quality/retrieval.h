// The retrieval evaluation of the long-context model: a context holding a fact
// (a pass key, one of several keys, a variable's last value) at some depth is prefilled
// and compressed query-agnostically (before the question arrives, as a shared or cached
// prefix would be), then the question is fed uncompressed and the answer decoded greedily;
// a case counts when every answer token matches. Results per method, budget, kind, depth.
//
// Cases file (written by models/longctx/retrieval_cases.py): one case per line,
//   KIND DEPTH | context ids (BOS first) | question ids | answer ids
//
// Thread-safety: functions only; the Transformer is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "centroidkv/client/client.h"
#include "worker/quality/methods.h"
#include "worker/transformer.h"

namespace centroidkv::worker::quality {

// The uncompressed cache, reported beside the methods at budget 1.
inline constexpr char kFullCache[] = "full";

struct RetrievalCase {
  std::string kind;
  double depth = 0.0;  // where the deciding fact sits in the context, 0..1
  std::vector<int32_t> context;
  std::vector<int32_t> question;
  std::vector<int32_t> answer;

  // The case's length class: the smallest power of two holding context, question and
  // answer (cases.py writes sequences of 256, 512 and 1024 tokens, "." after the answer).
  int32_t length_class() const;
};

// Reads a cases file. InvalidArgument naming the line for a malformed line, an id outside
// [0, vocab_size), a context not starting with BOS, an empty question or answer, or a case
// longer than `max_length` tokens.
absl::StatusOr<std::vector<RetrievalCase>> ReadRetrievalCases(const std::string& path,
                                                              int32_t vocab_size,
                                                              int32_t max_length);

// The greedy answer of `answer_length` tokens after `question`, fed onto `cache` (changed).
absl::StatusOr<std::vector<int32_t>> AnswerGreedily(Transformer& transformer,
                                                    const std::vector<int32_t>& question,
                                                    size_t answer_length, KvCache* cache);

// The answer's negative log-likelihood (nats, summed over its tokens) after `question`,
// teacher-forced onto `cache` (changed).
absl::StatusOr<double> AnswerNll(Transformer& transformer, const std::vector<int32_t>& question,
                                 const std::vector<int32_t>& answer, KvCache* cache);

// Exact-match counts of one method at one budget for one (kind, depth, length class).
struct RetrievalCell {
  std::string method;
  double budget = 1.0;
  std::string kind;
  double depth = 0.0;
  int32_t length = 0;  // RetrievalCase::length_class()
  int64_t hits = 0;
  int64_t cases = 0;
  int64_t entries_kept = 0;  // cache entries after compression, summed over cases
  int64_t entries_full = 0;
};

struct RetrievalSettings {
  std::vector<double> budgets = {0.5, 0.25, 0.1};
  std::vector<std::string> methods;  // names from AllMethods(); kFullCache is always added
  MethodSettings method_settings;
};

// Runs every case with the full cache and with every (budget, method). `client` may be
// null when no method needs the server. `progress` (optional) gets a line per case.
absl::StatusOr<std::vector<RetrievalCell>> RunRetrieval(
    Transformer& transformer, client::Client* client, const std::vector<RetrievalCase>& cases,
    const RetrievalSettings& settings, const std::function<void(const std::string&)>& progress);

// Outlier heads for retrieval: every (layer, KV head) compressed alone through the server
// at `budget` (every other head whole), on calibration cases (stories and a seed of their
// own), scored by the answers' summed negative log-likelihood; most harmful first.
struct HeadRetrievalScore {
  int32_t layer = 0;
  int32_t head = 0;
  double answer_nll = 0.0;  // summed over the cases
  int64_t hits = 0;         // greedy exact matches
  int64_t cases = 0;
};
absl::StatusOr<std::vector<HeadRetrievalScore>> ScoreHeadsOnCases(
    Transformer& transformer, client::Client& client, const std::vector<RetrievalCase>& cases,
    const MethodSettings& settings, double budget);

// Markdown: accuracy per method and budget (all kinds and per kind), then per depth and
// per length class.
std::string RetrievalMarkdown(const std::vector<RetrievalCell>& cells);

// One JSON line: [{method, budget, kind, depth, length, hits, cases, kv_kept}].
std::string RetrievalJson(const std::vector<RetrievalCell>& cells);

}  // namespace centroidkv::worker::quality
