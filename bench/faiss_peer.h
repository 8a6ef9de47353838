// The FAISS peer: the same per-chunk A-to-B matching as step 3 of SPEC section 2, done with
// FAISS brute-force inner-product search (IndexFlatIP over the normalised B half of a chunk,
// queried with the normalised A half, k = 1). Everything that is not the search itself
// (widening fp16, normalising, de-interleaving A and B, building the indexes) happens before
// timing, which favours the peer: the ratio we report is a lower bound on our advantage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/workload.h"

namespace centroidkv::bench {

enum class FaissThreading {
  kInternal,    // one search per chunk after another; FAISS (OpenMP) and BLAS use all threads
  kOverChunks,  // an OpenMP loop over (head, chunk); each search single-threaded
};

std::string_view FaissThreadingName(FaissThreading threading);

class FaissMatcher {
 public:
  // Prepares the indexes of every (head, chunk) of `workload` (untimed).
  FaissMatcher(const Workload& workload, const std::vector<ChunkSpan>& chunks);
  ~FaissMatcher();
  FaissMatcher(const FaissMatcher&) = delete;
  FaissMatcher& operator=(const FaissMatcher&) = delete;

  // Sets the OpenMP and BLAS thread counts for `threading` (call before timing).
  static void ConfigureThreads(FaissThreading threading, int32_t threads);

  // The timed part: one k=1 search per (head, chunk).
  void Match(FaissThreading threading, int32_t threads);

  // After Match(), for source i (sources in the order head, chunk, offset): the head-local
  // token index of the destination FAISS chose (-1 if none), and its score.
  int64_t DestinationToken(int64_t i) const;
  float Score(int64_t i) const { return scores_[i]; }
  // The head-local token index and head of source i.
  int32_t SourceToken(int64_t i) const { return source_tokens_[i]; }
  int32_t SourceHead(int64_t i) const { return source_heads_[i]; }
  int64_t num_sources() const { return static_cast<int64_t>(source_tokens_.size()); }

 private:
  struct Task;
  std::vector<Task> tasks_;
  std::vector<float> queries_;          // normalised A rows, task after task
  std::vector<int64_t> labels_;         // FAISS's answer: index into the chunk's B half
  std::vector<float> scores_;
  std::vector<int32_t> source_tokens_;
  std::vector<int32_t> source_heads_;
  std::vector<int32_t> source_chunk_begin_;
  int32_t dim_ = 0;
};

}  // namespace centroidkv::bench
