// GrpcCompressStream: job pipelining on the way out, slab reassembly on the way in.
#include "client/compress_stream_impl.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/client/shm_region.h"
#include "centroidkv/wire/job_codec.h"
#include "centroidkv/wire/region_codec.h"
#include "client/result_account.h"

namespace centroidkv::client {

GrpcCompressStream::GrpcCompressStream(v1::CentroidKV::Stub* stub, const ClientOptions& options)
    : options_(options) {
  if (options_.stream_deadline.count() > 0) {
    context_.set_deadline(std::chrono::system_clock::now() + options_.stream_deadline);
  }
  stub->async()->Compress(&context_, this);
  AddHold();  // writes may start from any thread until the stream is closed or broken
  StartRead(&response_);
  StartCall();
}

GrpcCompressStream::~GrpcCompressStream() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    if (!writes_done_started_) context_.TryCancel();
    changed_.wait(lock, [this] { return done_; });
  }
}

// ---------------------------------------------------------------------------------------
// Public calls.

absl::StatusOr<uint64_t> GrpcCompressStream::Submit(const LayerJob& job) {
  bool start_write = false, writes_done = false;
  uint64_t job_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || reads_ended_) {
      return final_status_.ok() ? absl::FailedPreconditionError("the stream has ended")
                                : final_status_;
    }
    if (close_requested_) return absl::FailedPreconditionError("the stream is closing");
    if (job.shm_region != nullptr) {
      // The region must hold the input (and any output slot) it names.
      const InputBytes bytes = InputBytesOf(job.layer);
      if (!job.shm_region->OffsetOf(job.layer.keys, bytes.keys).has_value() ||
          !job.shm_region->OffsetOf(job.layer.values, bytes.values).has_value() ||
          (bytes.counts > 0 &&
           !job.shm_region->OffsetOf(job.layer.counts, bytes.counts).has_value())) {
        return absl::InvalidArgumentError(
            "shm_region: the layer's keys, values and counts must lie inside the region");
      }
    } else if (job.shm_output.has_value()) {
      return absl::InvalidArgumentError("shm_output: needs shm_region");
    }
    job_id = next_job_id_++;
    if (job.shm_region != nullptr && job.shm_output.has_value()) {
      region_targets_[job_id] = RegionTarget{job.shm_region->data(), *job.shm_output};
    }
    Outgoing out;
    out.job_id = job_id;
    out.job = job;
    outgoing_.push_back(std::move(out));
    layer_of_[job_id] = job.layer_index;
    ++outstanding_;
    PrepareWrite(&start_write, &writes_done);
  }
  StartDecided(start_write, writes_done);
  return job_id;
}

absl::Status GrpcCompressStream::Cancel(uint64_t job_id) {
  bool start_write = false, writes_done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || reads_ended_ || close_requested_) {
      return absl::FailedPreconditionError("the stream is not open");
    }
    if (job_id == 0 || job_id >= next_job_id_) {
      return absl::NotFoundError(
          absl::StrCat("job ", job_id, " was not submitted on this stream"));
    }
    // Finished but not yet returned by Next(): drop it here; the server is done with it.
    if (DropCompleted(completed_, job_id)) {
      --outstanding_;
      changed_.notify_all();
      return absl::OkStatus();
    }
    // Already returned by Next() (or cancelled before): nothing left to drop.
    if (layer_of_.erase(job_id) == 0) return absl::OkStatus();
    // A reply not yet complete: forget what arrived of it and drop the rest when it comes.
    if (partial_.erase(job_id) == 0) cancelled_.insert(job_id);
    region_targets_.erase(job_id);
    --outstanding_;  // no result will be returned for it
    changed_.notify_all();
    // Stop sending the job (its buffers are no longer read after this call). If its
    // StartJob went out, the server is told to drop what it has; otherwise it never knew.
    Outgoing cancel;
    cancel.job_id = job_id;
    cancel.is_cancel = true;
    auto it = std::find_if(outgoing_.begin(), outgoing_.end(), [job_id](const Outgoing& out) {
      return !out.is_cancel && out.job_id == job_id;
    });
    if (it == outgoing_.end()) {
      outgoing_.push_back(std::move(cancel));
    } else if (it->slabs.has_value()) {
      *it = std::move(cancel);
    } else {
      outgoing_.erase(it);
      cancelled_.erase(job_id);  // the server never heard of it: no reply to drop
    }
    PrepareWrite(&start_write, &writes_done);
  }
  StartDecided(start_write, writes_done);
  return absl::OkStatus();
}

absl::StatusOr<LayerResult> GrpcCompressStream::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return !completed_.empty() || done_ || outstanding_ <= 0; });
  if (!completed_.empty()) {
    LayerResult result = std::move(completed_.front());
    completed_.pop_front();
    --outstanding_;
    return result;
  }
  if (done_ && !final_status_.ok()) return final_status_;
  if (outstanding_ <= 0) return absl::OutOfRangeError("every submitted job has been returned");
  return absl::InternalError(
      absl::StrCat("the stream ended with ", outstanding_, " jobs unanswered"));
}

absl::Status GrpcCompressStream::Close() {
  bool start_write = false, writes_done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    close_requested_ = true;
    PrepareWrite(&start_write, &writes_done);
  }
  StartDecided(start_write, writes_done);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return done_; });
  return final_status_;
}

void GrpcCompressStream::Abort() { context_.TryCancel(); }

std::string GrpcCompressStream::peer() const { return context_.peer(); }

// ---------------------------------------------------------------------------------------
// Writing.

void GrpcCompressStream::AddRegionSpans(const LayerJob& job, v1::StartJob* start) {
  const ShmRegion& region = *job.shm_region;
  const uint64_t id = region.region_id();
  const InputBytes bytes = InputBytesOf(job.layer);
  RegionInputSpans input;
  input.keys = {id, *region.OffsetOf(job.layer.keys, bytes.keys), bytes.keys};
  input.values = {id, *region.OffsetOf(job.layer.values, bytes.values), bytes.values};
  if (bytes.counts > 0) {
    input.counts = RegionSpan{id, *region.OffsetOf(job.layer.counts, bytes.counts), bytes.counts};
  }
  RegionInputToProto(input, start);
  if (job.shm_output.has_value()) {
    const ShmOutputSlot& slot = *job.shm_output;
    RegionOutputSpans output;
    output.keys = {id, slot.keys_offset, slot.keys_bytes};
    output.values = {id, slot.values_offset, slot.values_bytes};
    output.counts = {id, slot.counts_offset, slot.counts_bytes};
    if (job.options.compute_assignment) {
      output.assignment = RegionSpan{id, slot.assignment_offset, slot.assignment_bytes};
    }
    if (job.layer.queries != nullptr) {
      output.log_weights = RegionSpan{id, slot.log_weights_offset, slot.log_weights_bytes};
    }
    RegionOutputToProto(output, start);
  }
}

bool GrpcCompressStream::NextRequest() {
  while (!outgoing_.empty()) {
    Outgoing& out = outgoing_.front();
    request_.Clear();
    if (out.is_cancel) {
      request_.mutable_cancel_job()->set_job_id(out.job_id);
      outgoing_.pop_front();
      return true;
    }
    const LayerJob& job = out.job;
    if (!out.slabs.has_value()) {
      *request_.mutable_start_job() =
          StartJobToProto(out.job_id, job.layer_index, job.layer, job.options, job.output_dtype,
                          job.backend, job.timeout, job.priority);
      const InputBytes bytes = InputBytesOf(job.layer);
      // Scores and queries always go as slabs; the rest by reference where the job is in
      // shared memory (the spans go in the StartJob).
      std::vector<SlabWriter::Tensor> tensors;
      if (job.shm_region != nullptr) {
        AddRegionSpans(job, request_.mutable_start_job());
      } else {
        tensors = {{v1::TENSOR_KEYS, bytes.keys, job.layer.keys, {}},
                   {v1::TENSOR_VALUES, bytes.values, job.layer.values, {}},
                   {v1::TENSOR_COUNTS, bytes.counts, job.layer.counts, {}}};
      }
      tensors.push_back({v1::TENSOR_SCORES, bytes.scores, job.layer.scores, {}});
      tensors.push_back({v1::TENSOR_QUERIES, bytes.queries, job.layer.queries, {}});
      out.slabs.emplace(out.job_id, std::move(tensors), options_.slab_bytes);
      return true;
    }
    if (out.slabs->Next(request_.mutable_slab())) return true;
    outgoing_.pop_front();
  }
  return false;
}

void GrpcCompressStream::PrepareWrite(bool* start_write, bool* writes_done) {
  if (write_in_flight_ || reads_ended_ || done_ || writes_done_started_) return;
  if (NextRequest()) {
    write_in_flight_ = true;
    *start_write = true;
  } else if (close_requested_) {
    writes_done_started_ = true;
    write_in_flight_ = true;
    *writes_done = true;
  }
  if (*start_write || *writes_done) ++starts_pending_;
}

void GrpcCompressStream::StartDecided(bool start_write, bool writes_done) {
  if (!start_write && !writes_done) return;
  if (start_write) StartWrite(&request_);
  if (writes_done) StartWritesDone();
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --starts_pending_;
    ReleaseHoldLocked(&release);
  }
  if (release) RemoveHold();
}

void GrpcCompressStream::ReleaseHoldLocked(bool* release) {
  if (!hold_released_ && starts_pending_ == 0 && (writes_done_started_ || reads_ended_)) {
    hold_released_ = true;
    *release = true;
  }
}

// ---------------------------------------------------------------------------------------
// Reactions.

void GrpcCompressStream::OnWriteDone(bool ok) {
  bool start_write = false, writes_done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    write_in_flight_ = false;
    if (ok) PrepareWrite(&start_write, &writes_done);
    // A failed write means the stream is over; the read side reports why.
  }
  StartDecided(start_write, writes_done);
}

void GrpcCompressStream::OnWritesDoneDone(bool /*ok*/) {
  std::lock_guard<std::mutex> lock(mu_);
  write_in_flight_ = false;
}

void GrpcCompressStream::OnReadDone(bool ok) {
  if (ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      HandleResponse();
    }
    StartRead(&response_);
    return;
  }
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reads_ended_ = true;
    ReleaseHoldLocked(&release);
    changed_.notify_all();
  }
  if (release) RemoveHold();
}

void GrpcCompressStream::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  final_status_ = FromGrpcStatus(status);
  done_ = true;
  changed_.notify_all();
}

// ---------------------------------------------------------------------------------------
// Reassembly.

void GrpcCompressStream::HandleResponse() {
  switch (response_.message_case()) {
    case v1::CompressResponse::kResult: {
      const v1::JobResult& header = response_.result();
      // A cancelled job's header is dropped; its slabs then find no partial result.
      if (cancelled_.erase(header.job_id()) > 0) return;
      Incoming& incoming = partial_[header.job_id()];
      LayerResult& result = incoming.result;
      result.job_id = header.job_id();
      result.layer_index = header.layer_index();
      CompressResult shape;
      ResultProvenance provenance;
      result.status = JobResultHeaderFromProto(header, &shape, &provenance);
      if (!result.status.ok()) {
        FinishJobLocked(header.job_id());
        return;
      }
      result.dtype = shape.dtype;
      CopyShapeAndAccount(shape, &result);
      result.backend = std::move(provenance.backend);
      result.compute_seconds = provenance.compute_seconds;
      result.queue_seconds = provenance.queue_seconds;
      const ResultBytes bytes = ResultBytesOf(header);
      if (header.in_region()) {
        // Written to shared memory: the header is the whole reply.
        auto target = region_targets_.find(header.job_id());
        if (target == region_targets_.end()) {
          result.status = absl::DataLossError(
              "the server wrote a result to a region this job did not name");
        } else {
          const ShmOutputSlot& slot = target->second.slot;
          const uint8_t* base = target->second.base;
          LayerResult::RegionTensors tensors;
          tensors.keys = base + slot.keys_offset;
          tensors.keys_bytes = bytes.keys;
          tensors.values = base + slot.values_offset;
          tensors.values_bytes = bytes.values;
          tensors.counts = reinterpret_cast<const uint32_t*>(base + slot.counts_offset);
          tensors.assignment = reinterpret_cast<const int32_t*>(base + slot.assignment_offset);
          tensors.assignment_elements = bytes.assignment / sizeof(int32_t);
          if (bytes.log_weights > 0) {
            tensors.log_weights = reinterpret_cast<const float*>(base + slot.log_weights_offset);
          }
          result.in_region = tensors;
        }
        FinishJobLocked(header.job_id());
        return;
      }
      result.keys.resize(bytes.keys);
      result.values.resize(bytes.values);
      result.counts.resize(bytes.counts / sizeof(uint32_t));
      result.assignment.resize(bytes.assignment / sizeof(int32_t));
      result.log_weights.resize(bytes.log_weights / sizeof(float));
      incoming.slabs.emplace(
          header.job_id(),
          std::vector<SlabAssembler::Tensor>{
              {v1::TENSOR_OUT_KEYS, result.keys.data(), bytes.keys, "out_keys"},
              {v1::TENSOR_OUT_VALUES, result.values.data(), bytes.values, "out_values"},
              {v1::TENSOR_OUT_COUNTS, result.counts.data(), bytes.counts, "out_counts"},
              {v1::TENSOR_OUT_LOG_WEIGHTS, result.log_weights.data(), bytes.log_weights,
               "out_log_weights"},
              {v1::TENSOR_ASSIGNMENT, result.assignment.data(), bytes.assignment,
               "assignment"}},
          "result slab");
      if (incoming.slabs->complete()) FinishJobLocked(header.job_id());
      return;
    }
    case v1::CompressResponse::kSlab: {
      const v1::TensorSlab& slab = response_.slab();
      auto it = partial_.find(slab.job_id());
      if (it == partial_.end()) return;
      Incoming& incoming = it->second;
      if (absl::Status added = incoming.slabs->Add(slab); !added.ok()) {
        // The server broke the framing of this result: it cannot be trusted.
        incoming.result.status =
            absl::DataLossError(absl::StrCat("the server sent a bad result: ", added.message()));
      }
      if (!incoming.result.status.ok() || incoming.slabs->complete()) {
        FinishJobLocked(slab.job_id());
      }
      return;
    }
    case v1::CompressResponse::kError: {
      const v1::JobError& error = response_.error();
      if (cancelled_.erase(error.job_id()) > 0) return;
      LayerResult result;
      result.job_id = error.job_id();
      result.layer_index = layer_of_[error.job_id()];
      layer_of_.erase(error.job_id());
      result.status = StatusFromJobError(error);
      region_targets_.erase(error.job_id());
      StopSendingLocked(error.job_id());
      completed_.push_back(std::move(result));
      changed_.notify_all();
      return;
    }
    default:
      return;
  }
}

void GrpcCompressStream::FinishJobLocked(uint64_t job_id) {
  auto it = partial_.find(job_id);
  if (it == partial_.end()) return;
  LayerResult& result = it->second.result;
  if (!result.status.ok()) {
    // Nothing of a broken result is returned but its identity and the error.
    LayerResult failed;
    failed.job_id = result.job_id;
    failed.layer_index = result.layer_index;
    failed.status = result.status;
    completed_.push_back(std::move(failed));
  } else {
    completed_.push_back(std::move(result));
  }
  partial_.erase(it);
  layer_of_.erase(job_id);
  region_targets_.erase(job_id);
  StopSendingLocked(job_id);
  changed_.notify_all();
}

void GrpcCompressStream::StopSendingLocked(uint64_t job_id) {
  // The server drops slabs of a job it has answered; a message already in request_ is a copy.
  std::erase_if(outgoing_, [job_id](const Outgoing& out) {
    return !out.is_cancel && out.job_id == job_id;
  });
}

}  // namespace centroidkv::client
