// The gRPC implementation of CompressStream: a client bidi reactor (route_guide style)
// that writes queued jobs as StartJob + slabs, one write in flight, without waiting for
// replies, and reassembles result slabs into LayerResults, both through the protocol codec
// (proto/: StartJobToProto and SlabWriter out, JobResultHeaderFromProto and SlabAssembler in).
// Thread-safe: public calls and reactions meet under mu_; gRPC operations are started
// outside it. A hold keeps OnDone away while writes may still be started.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <grpcpp/grpcpp.h>

#include "centroidkv/client/client.h"
#include "centroidkv/v1/centroidkv.grpc.pb.h"
#include "centroidkv/wire/slab_codec.h"

namespace centroidkv::client {

// Drops job `job_id`'s result from a stream's finished-but-not-yet-returned queue; true if
// it was there (Cancel of a job that has finished).
inline bool DropCompleted(std::deque<LayerResult>& completed, uint64_t job_id) {
  return std::erase_if(completed, [&](const LayerResult& r) { return r.job_id == job_id; }) > 0;
}

class GrpcCompressStream final
    : public CompressStream,
      public grpc::ClientBidiReactor<v1::CompressRequest, v1::CompressResponse> {
 public:
  GrpcCompressStream(v1::CentroidKV::Stub* stub, const ClientOptions& options);
  ~GrpcCompressStream() override;

  absl::StatusOr<uint64_t> Submit(const LayerJob& job) override;
  absl::Status Cancel(uint64_t job_id) override;
  absl::StatusOr<LayerResult> Next() override;
  absl::Status Close() override;
  void Abort() override;
  // The server's address as gRPC names it ("ipv4:127.0.0.1:50051"); meaningful once the
  // first answer has arrived (before that, gRPC gives the channel's target).
  std::string peer() const;

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnWritesDoneDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // A queued outgoing message source: a job's StartJob and slabs, or one cancel.
  struct Outgoing {
    uint64_t job_id = 0;
    LayerJob job;
    bool is_cancel = false;
    std::optional<SlabWriter> slabs;  // set once the StartJob has gone out
  };
  // A result whose slabs are arriving.
  struct Incoming {
    LayerResult result;
    std::optional<SlabAssembler> slabs;  // into result's arrays
  };
  // Fills request_ with the next message; false when the queue is empty.
  bool NextRequest();
  // Decides the next write (under mu_): sets *start_write or *writes_done when due.
  void PrepareWrite(bool* start_write, bool* writes_done);
  void StartDecided(bool start_write, bool writes_done);
  void HandleResponse();
  // The StartJob spans of a job by reference to shared memory.
  static void AddRegionSpans(const LayerJob& job, v1::StartJob* start);
  void FinishJobLocked(uint64_t job_id);
  // Drops what is left to send of a job that has been answered: its buffers are the
  // caller's again once Next() returns its result.
  void StopSendingLocked(uint64_t job_id);
  void ReleaseHoldLocked(bool* release);

  const ClientOptions options_;
  grpc::ClientContext context_;

  std::mutex mu_;
  std::condition_variable changed_;
  v1::CompressRequest request_;
  v1::CompressResponse response_;
  std::deque<Outgoing> outgoing_;
  std::map<uint64_t, Incoming> partial_;  // results whose slabs are arriving
  std::deque<LayerResult> completed_;
  std::map<uint64_t, uint32_t> layer_of_;  // job id -> layer index, for error replies
  // Jobs whose result goes to shared memory: where (the region's base and the slot).
  struct RegionTarget {
    const uint8_t* base = nullptr;
    ShmOutputSlot slot;
  };
  std::map<uint64_t, RegionTarget> region_targets_;
  std::set<uint64_t> cancelled_;  // cancelled jobs whose reply (if any) is to be dropped
  uint64_t next_job_id_ = 1;
  int64_t outstanding_ = 0;  // submitted, not yet returned by Next()
  bool write_in_flight_ = false;
  bool close_requested_ = false;
  bool writes_done_started_ = false;
  bool reads_ended_ = false;
  bool hold_released_ = false;
  bool done_ = false;
  int32_t starts_pending_ = 0;  // writes decided under mu_ and not yet started
  absl::Status final_status_;
};

}  // namespace centroidkv::client
