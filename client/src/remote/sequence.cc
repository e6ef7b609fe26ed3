#include "remote/sequence.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/spin.h"
#include "komputed/core/status.h"
#include "komputed/v1/semantics_wire.h"
#include "remote/credentials.h"
#include "remote/rpc.h"

namespace kp::internal::remote {
namespace {

namespace core = komputed::core;
namespace v1 = komputed::v1;

std::vector<core::TensorFacts> FactsOf(const std::vector<std::shared_ptr<RemoteTensor>>& tensors) {
  std::vector<core::TensorFacts> facts;
  facts.reserve(tensors.size());
  for (const auto& t : tensors) facts.push_back(t->facts());
  return facts;
}

}  // namespace

RemoteSequence::RemoteSequence(const void* owner, std::shared_ptr<Connection> connection,
                               uint64_t handle)
    : BackendSequence(owner), connection_(std::move(connection)), handle_(handle) {}

RemoteSequence::~RemoteSequence() {
  v1::Command c;
  c.mutable_destroy_sequence()->set_handle(handle_);
  connection_->Defer(std::move(c));
}

absl::Status RemoteSequence::Encode(Recorded& r) {
  v1::wire::HandleOp wire{r.op.kind, {}, 0, std::nullopt, r.op.barrier};
  for (const auto& t : r.op.tensors) wire.tensors.push_back(t->handle());
  if (r.op.kind == core::OpKind::kDispatch) {
    wire.algorithm = r.op.algorithm->handle();
    // A record captures the push constants of its moment; sending them explicitly keeps that
    // true although records travel later than SetPushConstants calls.
    KD_ASSIGN_OR_RETURN(std::vector<uint8_t> push,
                        r.op.algorithm->ResolvePushConstants(r.op.push_constants));
    if (!push.empty()) wire.push_constants = std::move(push);
  }
  r.wire = v1::wire::ToWire(wire);
  return absl::OkStatus();
}

absl::Status RemoteSequence::Record(const Op& op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("cannot record: the sequence is running; await it first");
  }
  Recorded r;
  r.op.kind = op.kind;
  r.op.push_constants = op.push_constants;
  r.op.barrier = op.barrier;
  KD_ASSIGN_OR_RETURN(r.op.tensors, Unwrap(owner(), op.tensors));
  KD_RETURN_IF_ERROR(core::ValidateOpTensors(op.kind, FactsOf(r.op.tensors)));
  if (op.kind == core::OpKind::kBarrier && !op.tensors.empty()) {
    KD_RETURN_IF_ERROR(core::ValidateBarrierMasks(op.barrier));
  }
  if (op.kind == core::OpKind::kDispatch) {
    KD_ASSIGN_OR_RETURN(r.op.algorithm, Unwrap(owner(), op.algorithm));
  }
  KD_RETURN_IF_ERROR(Encode(r));  // last: it applies an override to the algorithm
  if (!recording_) {
    if (end_pending_) actions_.add_actions()->set_clear(true);
    end_pending_ = false;
    cb_ops_.clear();
    host_steps_ = true;
    recording_ = true;
  }
  *actions_.add_actions()->mutable_record() = r.wire;
  cb_ops_.push_back(r);
  all_ops_.push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status RemoteSequence::Submit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("the sequence is already running; await it first");
  }
  KD_ASSIGN_OR_RETURN(v1::EvalRequest request, PrepareLocked());
  KD_ASSIGN_OR_RETURN(in_flight_, connection_->ExecuteAsync(std::move(request)));
  return absl::OkStatus();
}

absl::Status RemoteSequence::Wait(absl::Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ == nullptr) return absl::OkStatus();
  auto p = in_flight_;
  // Polled first, as an in-process wait polls its fence (the answer often comes within it).
  const absl::Time spin_until = absl::Now() + std::min(timeout, connection_->spin());
  while (!p->done.load(std::memory_order_acquire) && absl::Now() < spin_until) {
    komputed::core::CpuRelax();
  }
  {
    std::unique_lock<std::mutex> plock(p->mu);
    bool done =
        p->cv.wait_for(plock, absl::ToChronoNanoseconds(timeout), [&] { return p->done.load(); });
    if (!done) {
      return absl::DeadlineExceededError(
          absl::StrCat("the submission did not complete within ", absl::FormatDuration(timeout)));
    }
  }
  in_flight_.reset();
  KD_RETURN_IF_ERROR(p->status);
  return FinishLocked(p->result);
}

absl::Status RemoteSequence::Eval(absl::Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("the sequence is already running; await it first");
  }
  KD_ASSIGN_OR_RETURN(v1::EvalRequest request, PrepareLocked());
  request.set_timeout_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(timeout)));
  if (auto same_host = connection_->EvalSameHost(request, timeout + RpcTimeout());
      same_host.has_value()) {
    KD_RETURN_IF_ERROR(same_host->status());
    return FinishLocked(**same_host);
  }
  grpc::ClientContext context;
  SetDeadline(context, timeout + RpcTimeout());
  v1::EvalResponse response;
  KD_RETURN_IF_ERROR(
      FromGrpcStatusWithHint(connection_->EvalOverGrpc(&context, request, &response), "eval"));
  return FinishLocked(response);
}

absl::Status RemoteSequence::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("cannot end: the sequence is running; await it first");
  }
  if (recording_) end_pending_ = true;
  recording_ = false;
  return absl::OkStatus();
}

absl::Status RemoteSequence::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("cannot clear: the sequence is running; await it first");
  }
  // The daemon keeps the batch's commands, and cb_ops_ the data that they move.
  actions_.add_actions()->set_clear(true);
  all_ops_.clear();
  host_steps_ = false;
  recording_ = false;
  end_pending_ = false;
  return absl::OkStatus();
}

absl::Status RemoteSequence::Rerecord() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_ != nullptr) {
    return absl::FailedPreconditionError("cannot rerecord: the sequence is running");
  }
  // Recorded again from scratch, each dispatch with the push constants of this moment (what a
  // rerecord does in-process).
  std::vector<Recorded> ops = all_ops_;
  for (Recorded& r : ops) {
    if (r.op.kind == core::OpKind::kDispatch) KD_RETURN_IF_ERROR(Encode(r));
  }
  if (ops.empty()) {
    // Nothing since the last clear, on the daemon too: its rerecord drops the kept batch.
    actions_.add_actions()->set_rerecord(true);
  } else {
    actions_.add_actions()->set_clear(true);
    for (const Recorded& r : ops) *actions_.add_actions()->mutable_record() = r.wire;
  }
  all_ops_ = std::move(ops);
  cb_ops_ = all_ops_;
  recording_ = !cb_ops_.empty();
  host_steps_ = true;
  end_pending_ = false;
  return absl::OkStatus();
}

bool RemoteSequence::IsRunning() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_ != nullptr;
}

bool RemoteSequence::IsRecording() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recording_;
}

std::vector<uint64_t> RemoteSequence::Timestamps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timestamps_;
}

// Builds the request for the batch about to run: deferred commands, this sequence's actions,
// the host data to upload, the data to bring back. Large data is streamed here, before.
absl::StatusOr<v1::EvalRequest> RemoteSequence::PrepareLocked() {
  v1::EvalRequest request;
  request.set_session_id(connection_->session_id());
  for (auto& c : connection_->TakeDeferred()) *request.add_commands() = std::move(c);
  if (actions_.actions_size() > 0) {
    actions_.set_sequence(handle_);
    *request.add_commands()->mutable_record() = std::move(actions_);
    actions_.Clear();
  }
  request.set_sequence(handle_);
  recording_ = false;  // a submission ends the recording, on the daemon too
  end_pending_ = false;

  // Which host data moves: that of the tensors that each operation touches (its own, and a
  // dispatch's algorithm's), by the operation's rule.
  std::vector<std::shared_ptr<RemoteTensor>> up, down;
  absl::flat_hash_set<uint64_t> up_seen, down_seen;
  auto add = [](std::vector<std::shared_ptr<RemoteTensor>>& v, absl::flat_hash_set<uint64_t>& s,
                const std::shared_ptr<RemoteTensor>& t) {
    if (s.insert(t->handle()).second) v.push_back(t);
  };
  for (const Recorded& r : cb_ops_) {
    std::vector<std::shared_ptr<RemoteTensor>> touched = r.op.tensors;
    if (r.op.algorithm != nullptr) {
      for (auto& t : r.op.algorithm->tensors()) touched.push_back(t);
    }
    for (const auto& t : touched) {
      if (t->shared()) continue;  // the daemon's host data is this very memory
      if (core::HostDataGoesUp(r.op.kind, t->spec().memory)) add(up, up_seen, t);
      if (core::HostDataComesBack(r.op.kind, t->spec().memory)) add(down, down_seen, t);
    }
  }
  uint64_t inline_bytes = 0;
  for (const auto& t : up) {
    if (inline_bytes + t->bytes() <= kInlineLimit) {
      inline_bytes += t->bytes();
      auto* u = request.add_uploads();
      u->set_handle(t->handle());
      u->mutable_data()->assign(reinterpret_cast<const char*>(t->host()), t->bytes());
    } else {
      // Commands first, so that the tensors exist in their final state, then the data.
      if (request.commands_size() > 0) {
        v1::EvalRequest flush;
        flush.set_session_id(connection_->session_id());
        flush.mutable_commands()->Swap(request.mutable_commands());
        grpc::ClientContext context;
        SetDeadline(context, RpcTimeout());
        v1::EvalResponse ignored;
        KD_RETURN_IF_ERROR(FromGrpcStatusWithHint(
            connection_->sequences().Eval(&context, flush, &ignored), "eval"));
      }
      KD_RETURN_IF_ERROR(connection_->bulk().Write(t->handle(), t->host(), t->bytes()));
    }
  }
  streamed_downloads_.clear();
  inline_bytes = 0;
  for (const auto& t : down) {
    if (inline_bytes + t->bytes() <= kInlineLimit) {
      inline_bytes += t->bytes();
      request.add_downloads(t->handle());
    } else {
      streamed_downloads_.push_back(t);
    }
  }
  inline_downloads_.clear();
  for (const auto& t : down) inline_downloads_[t->handle()] = t;
  return request;
}

// Applies what came back: downloads, then the copies' host steps, then timestamps.
absl::Status RemoteSequence::FinishLocked(const v1::EvalResponse& response) {
  for (const auto& d : response.downloads()) {
    auto it = inline_downloads_.find(d.handle());
    if (it == inline_downloads_.end()) continue;
    const auto& t = it->second;
    if (d.offset() > t->bytes() || d.data().size() > t->bytes() - d.offset()) {
      return absl::DataLossError(absl::StrCat("download of tensor ", d.handle(),
                                              " does not fit its ", t->bytes(), " bytes"));
    }
    std::memcpy(t->host() + d.offset(), d.data().data(), d.data().size());
  }
  for (const auto& t : streamed_downloads_) {
    KD_RETURN_IF_ERROR(connection_->bulk().Read(t->handle(), t->host(), t->bytes()));
  }
  for (const Recorded& r : cb_ops_) {
    if (!host_steps_ || r.op.kind != core::OpKind::kCopy) continue;
    const auto& t = r.op.tensors;
    for (size_t i : core::CopyHostTargets(FactsOf(t))) {
      std::memcpy(t[i]->host(), t[0]->host(), t[0]->bytes());
    }
  }
  timestamps_.assign(response.timestamps_ns().begin(), response.timestamps_ns().end());
  return absl::OkStatus();
}

}  // namespace kp::internal::remote
