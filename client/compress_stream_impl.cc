// GrpcCompressStream: job pipelining on the way out, slab reassembly on the way in.
#include "client/compress_stream_impl.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "centroidkv/common/field_status.h"
#include "centroidkv/wire/account_convert.h"
#include "centroidkv/wire/grpc_status.h"
#include "centroidkv/wire/wire_convert.h"

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
    job_id = next_job_id_++;
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
    for (auto it = completed_.begin(); it != completed_.end(); ++it) {
      if (it->job_id == job_id) {
        completed_.erase(it);
        --outstanding_;
        changed_.notify_all();
        return absl::OkStatus();
      }
    }
    // Already returned by Next() (or cancelled before): nothing left to drop.
    if (layer_of_.erase(job_id) == 0) return absl::OkStatus();
    // A reply not yet complete: forget what arrived of it and drop the rest when it comes.
    if (partial_.erase(job_id) == 0) cancelled_.insert(job_id);
    missing_bytes_.erase(job_id);
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
    } else if (it->stage > 0) {
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

uint64_t GrpcCompressStream::StageBytes(const Outgoing& out) const {
  const LayerView& layer = out.job.layer;
  const uint64_t rows = uint64_t(layer.TotalRows());
  switch (out.stage) {
    case 1:
      return rows * layer.key_dim * DTypeSize(layer.dtype);
    case 2:
      return rows * layer.value_dim * DTypeSize(layer.dtype);
    case 3:
      return layer.counts != nullptr ? rows * sizeof(uint32_t) : 0;
    default:
      return 0;
  }
}

const uint8_t* GrpcCompressStream::StageData(const Outgoing& out) const {
  const LayerView& layer = out.job.layer;
  switch (out.stage) {
    case 1:
      return static_cast<const uint8_t*>(layer.keys);
    case 2:
      return static_cast<const uint8_t*>(layer.values);
    default:
      return reinterpret_cast<const uint8_t*>(layer.counts);
  }
}

bool GrpcCompressStream::NextRequest() {
  static constexpr v1::Tensor kStageTensor[] = {v1::TENSOR_UNSPECIFIED, v1::TENSOR_KEYS,
                                                v1::TENSOR_VALUES, v1::TENSOR_COUNTS};
  while (!outgoing_.empty()) {
    Outgoing& out = outgoing_.front();
    if (out.is_cancel) {
      request_.Clear();
      request_.mutable_cancel_job()->set_job_id(out.job_id);
      outgoing_.pop_front();
      return true;
    }
    if (out.stage == 0) {
      const LayerJob& job = out.job;
      request_.Clear();
      v1::StartJob* start = request_.mutable_start_job();
      start->set_job_id(out.job_id);
      start->set_layer_index(job.layer_index);
      start->set_num_heads(static_cast<uint32_t>(job.layer.num_heads));
      start->set_num_tokens(static_cast<uint32_t>(job.layer.num_tokens));
      start->set_key_dim(static_cast<uint32_t>(job.layer.key_dim));
      start->set_value_dim(static_cast<uint32_t>(job.layer.value_dim));
      start->set_dtype(DTypeToProto(job.layer.dtype));
      start->set_layout(LayoutToProto(job.layer.layout));
      start->set_has_counts(job.layer.counts != nullptr);
      *start->mutable_params() = OptionsToProto(job.options);
      start->set_return_assignment(job.options.compute_assignment);
      if (job.output_dtype.has_value()) start->set_output_dtype(DTypeToProto(*job.output_dtype));
      start->set_backend(BackendToProto(job.backend));
      if (job.layer.head_offsets != nullptr) {
        for (int32_t h = 0; h < job.layer.num_heads; ++h) {
          start->add_head_tokens(static_cast<uint32_t>(job.layer.HeadTokens(h)));
        }
      }
      start->set_pad_heads(job.options.pad_heads);
      start->set_pad_to(static_cast<uint32_t>(std::max(job.options.pad_to, 0)));
      start->set_exact_target(job.options.exact_target);
      if (job.options.output_layout != TensorLayout::kHeadMajor) {
        start->set_output_layout(LayoutToProto(job.options.output_layout));
      }
      start->set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(job.timeout.count(), 0)));
      start->set_priority(job.priority);
      out.stage = 1;
      out.cursor = 0;
      return true;
    }
    const uint64_t total = StageBytes(out);
    if (out.stage <= 3 && out.cursor < total) {
      const uint64_t length =
          std::min<uint64_t>(static_cast<uint64_t>(options_.slab_bytes), total - out.cursor);
      request_.Clear();
      v1::TensorSlab* slab = request_.mutable_slab();
      slab->set_job_id(out.job_id);
      slab->set_tensor(kStageTensor[out.stage]);
      slab->set_byte_offset(out.cursor);
      slab->set_data(StageData(out) + out.cursor, length);
      out.cursor += length;
      return true;
    }
    if (out.stage < 3) {
      ++out.stage;
      out.cursor = 0;
    } else {
      outgoing_.pop_front();
    }
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
      LayerResult result;
      result.job_id = header.job_id();
      result.layer_index = header.layer_index();
      auto dtype = DTypeFromProto(header.dtype(), "result.dtype");
      result.dtype = dtype.ok() ? *dtype : DType::kFloat32;
      result.num_heads = static_cast<int32_t>(header.num_heads());
      result.num_tokens = static_cast<int32_t>(header.num_tokens());
      result.key_dim = static_cast<int32_t>(header.key_dim());
      result.value_dim = static_cast<int32_t>(header.value_dim());
      result.offsets.assign(header.offsets().begin(), header.offsets().end());
      result.keys.resize(header.out_keys_bytes());
      result.values.resize(header.out_values_bytes());
      result.counts.resize(header.out_counts_bytes() / sizeof(uint32_t));
      result.assignment.resize(header.assignment_bytes() / sizeof(int32_t));
      result.backend = header.backend();
      result.passes_run = static_cast<int32_t>(header.passes_run());
      result.compute_seconds = header.compute_seconds();
      result.queue_seconds = header.queue_seconds();
      CompressResult account;
      AccountFromProto(header, &account);
      result.target_length = account.target_length;
      result.target_reached = account.target_reached;
      result.head_entries.assign(account.head_entries.begin(), account.head_entries.end());
      result.head_input_tokens = std::move(account.head_input_tokens);
      result.stop_reasons = std::move(account.stop_reasons);
      result.head_tokens.assign(account.head_tokens.begin(), account.head_tokens.end());
      result.padded_length = account.padded_length;
      result.layout = account.layout;
      const uint64_t missing = header.out_keys_bytes() + header.out_values_bytes() +
                               header.out_counts_bytes() + header.assignment_bytes();
      partial_[header.job_id()] = std::move(result);
      missing_bytes_[header.job_id()] = missing;
      if (missing == 0) FinishJobLocked(header.job_id());
      return;
    }
    case v1::CompressResponse::kSlab: {
      const v1::TensorSlab& slab = response_.slab();
      auto it = partial_.find(slab.job_id());
      if (it == partial_.end()) return;
      LayerResult& result = it->second;
      uint8_t* base = nullptr;
      uint64_t size = 0;
      switch (slab.tensor()) {
        case v1::TENSOR_OUT_KEYS:
          base = result.keys.data(), size = result.keys.size();
          break;
        case v1::TENSOR_OUT_VALUES:
          base = result.values.data(), size = result.values.size();
          break;
        case v1::TENSOR_OUT_COUNTS:
          base = reinterpret_cast<uint8_t*>(result.counts.data());
          size = result.counts.size() * sizeof(uint32_t);
          break;
        case v1::TENSOR_ASSIGNMENT:
          base = reinterpret_cast<uint8_t*>(result.assignment.data());
          size = result.assignment.size() * sizeof(int32_t);
          break;
        default:
          return;
      }
      if (slab.byte_offset() > size || slab.data().size() > size - slab.byte_offset()) {
        result.status = absl::DataLossError("server sent a result slab past the tensor's end");
        FinishJobLocked(slab.job_id());
        return;
      }
      std::memcpy(base + slab.byte_offset(), slab.data().data(), slab.data().size());
      uint64_t& missing = missing_bytes_[slab.job_id()];
      missing -= std::min<uint64_t>(missing, slab.data().size());
      if (missing == 0) FinishJobLocked(slab.job_id());
      return;
    }
    case v1::CompressResponse::kError: {
      const v1::JobError& error = response_.error();
      if (cancelled_.erase(error.job_id()) > 0) return;
      LayerResult result;
      result.job_id = error.job_id();
      result.layer_index = layer_of_[error.job_id()];
      layer_of_.erase(error.job_id());
      result.status = absl::Status(FromWireCode(error.code()), error.message());
      if (!error.field().empty()) {
        FieldLocation location{error.field()};
        if (error.has_head()) location.head = error.head();
        if (error.has_token()) location.token = error.token();
        result.status = FieldError(result.status.code(), location, error.message());
      }
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
  completed_.push_back(std::move(it->second));
  partial_.erase(it);
  layer_of_.erase(job_id);
  missing_bytes_.erase(job_id);
  changed_.notify_all();
}

}  // namespace centroidkv::client
