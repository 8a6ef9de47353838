// libFuzzer target: one Compress stream's requests, decoded and assembled into jobs as the
// server does it, without a network. Each frame (stream_frames.h) is one CompressRequest;
// start_job goes through IncomingJob::Create (wire conversions, shape and size checks,
// buffers), slabs through IncomingJob::AddSlab, and a complete job runs on the engine its
// backend selects (service/compress_reactor.cc's checks per stream are mirrored here).
// Properties: every refusal carries a message and one of the codes a bad client gets
// (never INTERNAL or UNKNOWN); a complete job's result conserves each head's token count and
// its assignment stays inside its head. Jobs are capped at 4 KiB of input so each input
// runs in milliseconds; the engine runs on jobs of at most 64 tokens per head (the
// matching is quadratic in the chunk size).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string_view>

#include "centroidkv/kernels/engine_factory.h"
#include "fuzz/stream_frames.h"
#include "service/incoming_job.h"
#include "service/server_options.h"

namespace {

namespace v1 = ::centroidkv::v1;
using centroidkv::service::IncomingJob;

constexpr uint64_t kMaxJobBytes = 4 << 10;
constexpr int32_t kMaxEngineTokens = 64;
constexpr int kMaxFrames = 64;

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "compress_stream_fuzzer: %s\n", what);
    std::abort();
  }
}

// What a client's mistake may earn; anything else (INTERNAL, UNKNOWN, OK with no message)
// would be a server bug.
void CheckRefusal(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  Check(code == absl::StatusCode::kInvalidArgument ||
            code == absl::StatusCode::kFailedPrecondition ||
            code == absl::StatusCode::kResourceExhausted,
        "refusal has an unexpected code");
  Check(!status.message().empty(), "refusal without a message");
}

const centroidkv::service::ServerOptions& Options() {
  static const centroidkv::service::ServerOptions* const options = [] {
    auto* o = new centroidkv::service::ServerOptions();
    o->max_job_bytes = kMaxJobBytes;
    return o;
  }();
  return *options;
}

// Destroyed at exit, before LeakSanitizer's final check: the cpu engine's per-thread scratch
// lives in oneTBB containers whose offset pointers LSan cannot follow, so an engine kept
// alive to the end would be reported as leaking that scratch.
const centroidkv::EngineSet& Engines() {
  static const std::unique_ptr<centroidkv::EngineSet> engines =
      centroidkv::EngineSet::CreateAvailable(Options().engine_limits);
  return *engines;
}

// Runs a complete job as the server's RunJob does and checks the result's bookkeeping.
void RunJob(const IncomingJob& job, const centroidkv::ClusterEngine& engine) {
  const centroidkv::LayerView& view = job.view();
  if (view.num_tokens > kMaxEngineTokens) return;
  centroidkv::CompressOptions options = job.options();
  if (engine.caps().WritesResultDType(job.output_dtype())) options.result_dtype = job.output_dtype();
  absl::StatusOr<centroidkv::CompressResult> result = engine.Compress(view, options);
  if (!result.ok()) {
    // Bad data (NaN, Inf, zero counts) is the client's; a valid job may not fail here.
    // (pad_to below a head's length is FAILED_PRECONDITION; limits RESOURCE_EXHAUSTED.)
    const absl::StatusCode code = result.status().code();
    Check(code == absl::StatusCode::kInvalidArgument ||
              code == absl::StatusCode::kFailedPrecondition ||
              code == absl::StatusCode::kOutOfRange ||
              code == absl::StatusCode::kResourceExhausted,
          "engine failed a job with a code that is not the client's");
    Check(!result.status().message().empty(), "engine error without a message");
    return;
  }
  // The bookkeeping below is that of plain head-major jobs; ragged input, padded heads and
  // token-major output have their own exact tests (tests/kernels/ragged_layer_test.cc).
  if (view.head_offsets != nullptr || options.pad_heads || options.pad_to > 0 ||
      options.output_layout != centroidkv::TensorLayout::kHeadMajor) {
    return;
  }
  const int64_t n = view.num_tokens;
  Check(result->offsets.size() == static_cast<size_t>(view.num_heads) + 1 &&
            result->offsets[0] == 0,
        "offsets do not cover the heads");
  Check(result->counts.size() == static_cast<size_t>(result->total_entries()),
        "counts do not match the entries");
  Check(result->key_elements() == static_cast<size_t>(result->total_entries()) * view.key_dim &&
            result->value_elements() ==
                static_cast<size_t>(result->total_entries()) * view.value_dim,
        "rows do not match the entries");
  for (int32_t h = 0; h < view.num_heads; ++h) {
    const int64_t begin = result->offsets[h], end = result->offsets[h + 1];
    Check(begin <= end && end - begin <= n, "a head's entry range is reversed or too long");
    uint64_t in_total = static_cast<uint64_t>(n);
    if (view.counts != nullptr) {
      in_total = std::accumulate(view.counts + h * n, view.counts + (h + 1) * n, uint64_t{0});
    }
    const uint64_t out_total = std::accumulate(result->counts.begin() + begin,
                                               result->counts.begin() + end, uint64_t{0});
    Check(in_total == out_total, "a head's counts are not conserved");
    if (options.compute_assignment) {
      for (int64_t t = 0; t < n; ++t) {
        const int32_t row = result->assignment[static_cast<size_t>(h * n + t)];
        // Count-0 rows are padding: never merged, not returned, assigned -1.
        const bool padding = view.counts != nullptr && view.counts[h * n + t] == 0;
        Check(row == -1 ? padding : (row >= 0 && row < end - begin),
              "assignment points outside its head");
      }
    }
  }
}

// The stream's table of jobs receiving data, with the reactor's checks.
class Stream {
 public:
  // Returns the status that would end the stream, or OK to read on.
  absl::Status Handle(const v1::CompressRequest& request) {
    switch (request.message_case()) {
      case v1::CompressRequest::kStartJob:
        return Start(request.start_job());
      case v1::CompressRequest::kSlab:
        return Slab(request.slab());
      case v1::CompressRequest::kCancelJob:
        receiving_.erase(request.cancel_job().job_id());
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(
            "request: a CompressRequest must hold start_job, slab or cancel_job");
    }
  }

 private:
  struct Receiving {
    std::unique_ptr<IncomingJob> job;
    const centroidkv::ClusterEngine* engine;
  };

  absl::Status Start(const v1::StartJob& start) {
    if (receiving_.count(start.job_id()) != 0) {
      return absl::FailedPreconditionError("start_job.job_id is already in flight");
    }
    absl::StatusOr<std::unique_ptr<IncomingJob>> job = IncomingJob::Create(start, Options());
    if (!job.ok()) return job.status();
    const IncomingJob& created = **job;
    Check(created.job_id() == start.job_id(), "job id changed");
    Check(created.footprint_bytes() > 0, "a job without a footprint");
    absl::StatusOr<const centroidkv::ClusterEngine*> engine =
        Engines().Select(created.backend());
    if (!engine.ok()) return engine.status();
    receiving_.emplace(start.job_id(), Receiving{std::move(*job), *engine});
    return absl::OkStatus();
  }

  absl::Status Slab(const v1::TensorSlab& slab) {
    auto it = receiving_.find(slab.job_id());
    if (it == receiving_.end()) {
      return absl::FailedPreconditionError("slab.job_id is not a job receiving data");
    }
    if (absl::Status status = it->second.job->AddSlab(slab); !status.ok()) return status;
    if (it->second.job->complete()) {
      RunJob(*it->second.job, *it->second.engine);
      receiving_.erase(it);
    }
    return absl::OkStatus();
  }

  std::map<uint64_t, Receiving> receiving_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  centroidkv::fuzz::FrameReader frames(data, size);
  Stream stream;
  std::string_view frame;
  for (int i = 0; i < kMaxFrames && frames.Next(&frame); ++i) {
    v1::CompressRequest request;
    // gRPC hands the reactor only messages that parse.
    if (!request.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) return 0;
    absl::Status status = stream.Handle(request);
    if (!status.ok()) {
      CheckRefusal(status);
      return 0;  // the server ends the stream with this status
    }
  }
  return 0;
}
