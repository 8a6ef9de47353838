// The C++ client library of CentroidKV: what an inference worker links to send layer jobs
// to a server and get centroids, counts and assignments back.
//
//   auto client = Client::Connect({.target = "unix:///run/ckv.sock"});
//   auto stream = (*client)->OpenStream();
//   stream->Submit(job_for_layer_0);   // pipelined: returns once queued
//   stream->Submit(job_for_layer_1);
//   auto result = stream->Next();      // whichever job finishes first
//
// No gRPC, TBB or CUDA types appear here. Client and CompressStream are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "centroidkv/types/compress_options.h"
#include "centroidkv/types/compress_result.h"
#include "centroidkv/types/kinds.h"
#include "centroidkv/types/layer_view.h"

namespace centroidkv::client {

struct ClientOptions {
  // "host:port", "unix:///path/to.sock", or any gRPC target such as "dns:///svc:50051".
  std::string target = "127.0.0.1:50051";
  // Payload bytes per slab sent (64 KiB - 1 MiB is the sweet spot for gRPC); a stream
  // never sends slabs above the server's GetInfo max_slab_bytes (asked once per Client).
  int32_t slab_bytes = 256 << 10;
  // Largest message accepted from the server (result slabs are 1 MiB by default).
  int32_t max_message_bytes = 8 << 20;
  // Deadline of each stream, counted from its opening; zero means none.
  std::chrono::milliseconds stream_deadline{0};
  // How long Connect() waits for the channel to become ready; zero: do not wait.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};

  // Security (docs/security.md). TLS is on when tls_ca or tls_cert is set.
  std::string tls_ca;           // CA bundle (PEM) the server's certificate must chain to
  std::string tls_cert;         // client certificate chain (PEM), for mTLS, with tls_key
  std::string tls_key;          // its private key (PEM)
  std::string tls_server_name;  // name the server certificate must carry (default: target's host)
  // Sent as `authorization: Bearer <token>` on every call; empty = none. The CLI tools
  // take it from --auth-token or $CENTROIDKV_TOKEN.
  std::string auth_token;
};

class ShmRegion;

// Where a job's result goes in shared memory: byte offsets (and capacities) in the job's
// region for each result tensor; each must hold the largest result the job can have
// (ShmLayerStack lays them out).
struct ShmOutputSlot {
  uint64_t keys_offset = 0, keys_bytes = 0;
  uint64_t values_offset = 0, values_bytes = 0;
  uint64_t counts_offset = 0, counts_bytes = 0;
  uint64_t assignment_offset = 0, assignment_bytes = 0;  // with compute_assignment
  uint64_t log_weights_offset = 0, log_weights_bytes = 0;  // a fitted job (layer.queries)
};

// One layer job. The buffers in `layer` are borrowed: they must stay valid until the
// job's result has been returned by Next() (or the job was cancelled, or the stream ended).
// `layer.scores` makes it a scored job and `layer.queries` a fitted one
// (docs/scored-jobs.md); both always travel as slabs.
struct LayerJob {
  uint32_t layer_index = 0;
  LayerView layer;
  CompressOptions options;           // options.compute_assignment asks for the assignment
  std::optional<DType> output_dtype;  // default: the input dtype
  BackendKind backend = BackendKind::kAuto;
  // Dropped by the server (DEADLINE_EXCEEDED in LayerResult::status) unless done within
  // this time of its StartJob's arrival; zero = no deadline.
  std::chrono::milliseconds timeout{0};
  int32_t priority = 0;  // higher runs first among the server's queued jobs
  // Shared memory (shm_region.h), on a unix socket connection: with `shm_region` set and
  // `layer`'s tensors inside it, the server reads them in place (no slabs); with
  // `shm_output` too, it writes the result there and LayerResult::in_region points at it.
  // The server reads and writes these while the job runs, even after Cancel() returns
  // (until it sees the cancel); the slabs path's "not read after Cancel" does not hold.
  const ShmRegion* shm_region = nullptr;
  std::optional<ShmOutputSlot> shm_output;
};

// The result of one job, heads concatenated along the entry axis.
struct LayerResult {
  uint64_t job_id = 0;
  uint32_t layer_index = 0;
  absl::Status status;  // a per-job failure (e.g. RESOURCE_EXHAUSTED); the rest is empty
  DType dtype = DType::kFloat32;  // of keys and values
  int32_t num_heads = 0;
  int32_t num_tokens = 0;
  int32_t key_dim = 0;
  int32_t value_dim = 0;
  std::vector<int64_t> offsets;    // [H + 1]
  std::vector<uint8_t> keys;       // [total, key_dim] of dtype, little-endian
  std::vector<uint8_t> values;     // [total, value_dim] of dtype
  std::vector<uint32_t> counts;    // [total]
  std::vector<int32_t> assignment; // [H, n] ([sum head_tokens] if ragged), -1 for padding;
                                   // empty unless asked for
  std::string backend;
  int32_t passes_run = 0;
  double compute_seconds = 0.0;
  double queue_seconds = 0.0;
  // The honest account (empty / zero from servers before it):
  int64_t target_length = 0;             // t
  bool target_reached = false;           // every compressed head has at most t entries
  std::vector<uint32_t> head_entries;    // [H] real entries (count > 0) per head
  std::vector<uint64_t> head_input_tokens;  // [H] sum of the input counts per head
  std::vector<StopReason> stop_reasons;  // [H]
  std::vector<uint32_t> head_tokens;     // [H] input entries per head
  int32_t padded_length = 0;             // rows per head when padded
  TensorLayout layout = TensorLayout::kHeadMajor;  // of keys, values and counts
  // fp8 results: each head's scale ([H]); a key element of head h stands for its fp8 value
  // x key_scales[h]. Empty for other dtypes.
  std::vector<float> key_scales;
  std::vector<float> value_scales;
  // Budgeted jobs: each head's budget; scored jobs: its entries kept exact ([H]; else empty).
  std::vector<int32_t> head_budgets;
  std::vector<int32_t> head_exact_entries;
  // Fitted jobs: each row's log-weight ([total]), added to its key's logit instead of
  // ln(count); empty for other jobs.
  std::vector<float> log_weights;
  // A job with LayerJob::shm_output: the tensors were written to the region (keys, values,
  // counts and assignment above stay empty); these point at them, valid while the region
  // lives and until its slot is used again. Sizes as the vectors above would have.
  struct RegionTensors {
    const uint8_t* keys = nullptr;
    uint64_t keys_bytes = 0;
    const uint8_t* values = nullptr;
    uint64_t values_bytes = 0;
    const uint32_t* counts = nullptr;  // [total]
    const int32_t* assignment = nullptr;
    uint64_t assignment_elements = 0;
    const float* log_weights = nullptr;  // a fitted job: [total]
  };
  std::optional<RegionTensors> in_region;

  int64_t total_entries() const { return offsets.empty() ? 0 : offsets.back(); }
  // The rows as float (fp8 rows times their head's scale).
  std::vector<float> KeysAsFloat() const;
  std::vector<float> ValuesAsFloat() const;
};

// Packs an in-process engine result the way the server would send it, rounding keys and
// values once to `output_dtype` (used by `centroidkv compress --local`); a result the engine
// quantised to fp8 itself (CompressOptions::result_dtype) is taken as it is.
LayerResult LayerResultFromEngine(uint32_t layer_index, const CompressResult& result,
                                  DType output_dtype);

// An accelerator of the server (GetInfoResponse.device_info).
struct ServerDevice {
  std::string backend;  // e.g. "cuda:0"
  std::string name;     // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;
  int32_t compute_major = 0;
  int32_t compute_minor = 0;
};

struct ServerInfo {
  std::string version;
  std::vector<std::string> backends;
  std::string default_backend;
  std::vector<std::string> devices;
  std::vector<ServerDevice> device_info;  // the same devices in detail
  int64_t max_job_bytes = 0;
  int64_t max_stream_bytes = 0;
  int64_t max_total_bytes = 0;
  int32_t max_message_bytes = 0;
  int32_t max_slab_bytes = 0;  // largest slab payload taken (0: an older server)
  int32_t max_tokens = 0;
  int32_t max_heads = 0;
  int32_t max_dim = 0;
  int32_t max_chunk_size = 0;  // largest chunk_size a job may ask for (0: an older server)
  int32_t worker_threads = 0;  // clustering threads of the server (0: an older server)
  bool shared_memory = false;  // this connection may register shared memory regions
};

// One Compress stream: jobs go out as fast as gRPC flow control allows, results come back
// in completion order.
class CompressStream {
 public:
  virtual ~CompressStream() = default;

  // Queues a job and returns its id at once. Fails if the stream has ended.
  virtual absl::StatusOr<uint64_t> Submit(const LayerJob& job) = 0;
  // Asks the server to drop a job; no result will come for it, even if it had already
  // arrived, and its buffers are not read after this returns. Cancelling a job already
  // returned by Next() does nothing; an id never submitted on this stream is NotFound.
  virtual absl::Status Cancel(uint64_t job_id) = 0;
  // Blocks until some submitted job finishes and returns it (a per-job failure is in
  // LayerResult::status). Returns the stream's error if it broke, and OutOfRange when
  // every submitted job has been returned.
  virtual absl::StatusOr<LayerResult> Next() = 0;
  // Half-closes, waits for the stream to end and returns its final status.
  virtual absl::Status Close() = 0;
  // Cancels the whole stream (pending jobs are dropped by the server).
  virtual void Abort() = 0;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  virtual absl::StatusOr<ServerInfo> GetInfo() = 0;
  virtual std::unique_ptr<CompressStream> OpenStream() = 0;

  // Shared memory regions (shm_region.h wraps these): `name` is a POSIX shm name or a file
  // under /dev/shm owned by this process's uid. Only on a unix socket connection
  // (FAILED_PRECONDITION otherwise). The server unmaps them on Unregister or when this
  // process exits.
  struct Region {
    uint64_t region_id = 0;
    std::string name;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  virtual absl::StatusOr<Region> RegisterRegion(const std::string& name, uint64_t offset,
                                                uint64_t size);
  virtual absl::Status UnregisterRegion(uint64_t region_id);
  virtual absl::StatusOr<std::vector<Region>> ListRegions();

  // Sends every job on one stream, pipelined, and returns the results in the order of
  // `jobs`. A per-job failure is in its LayerResult::status.
  absl::StatusOr<std::vector<LayerResult>> CompressLayers(const std::vector<LayerJob>& jobs);
};

}  // namespace centroidkv::client
