#include "services.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "komputed/v1/execute_wire.h"
#include "session_wire.h"
#include "status.h"
#include "tensor_io.h"

namespace komputed::server {
namespace {

// Room in a message for everything but a chunk's data bytes.
constexpr uint64_t kChunkOverhead = 1024;

// A tensor of at least this many elements is created on the build pool: filling its memory
// (zeros or the initial data, in staging and, where the device maps it, the buffer) takes
// milliseconds per MiB, and gRPC has few serving threads (two on a two-core host), so a few such
// requests at once would hold up every other client's calls for seconds.
constexpr uint64_t kBuildPoolTensorElements = uint64_t{1} << 18;

// Whether an eval's commands create a tensor that is created on the build pool.
bool CreatesLargeTensor(const v1::EvalRequest& request) {
  for (const v1::Command& command : request.commands()) {
    if (command.has_create_tensor() &&
        command.create_tensor().count() >= kBuildPoolTensorElements) {
      return true;
    }
  }
  return false;
}

// Answers a unary call with `status`, logging a failure with the method and the session that
// the request names (empty when none).
// A failure of an authenticated caller counts as its tenant's error.
void Reply(const grpc::ServerContext* context, const Answer& answer, absl::string_view method,
           absl::string_view session_id, const absl::Status& status,
           const Caller* caller = nullptr) {
  if (!status.ok()) LogFailure(method, session_id, context->peer(), status);
  if (caller != nullptr) caller->account->CountError(status);
  answer(ToGrpcStatus(status));
}

// Authenticates the caller, looks its session up and replies with what `fn(session)` returns.
template <typename Fn>
void InSession(const grpc::ServerContext* context, const Answer& answer, absl::string_view method,
               const ServiceContext& ctx, const std::string& session_id, Fn&& fn) {
  absl::StatusOr<Caller> caller = ctx.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, method, "", caller.status());
  absl::StatusOr<std::shared_ptr<Session>> session = ctx.sessions->Get(session_id, *caller);
  if (!session.ok()) return Reply(context, answer, method, session_id, session.status(), &*caller);
  Reply(context, answer, method, session_id, fn(**session), &*caller);
}

// Runs `job` on the build pool and answers the call with the status it returns (logged and
// counted as `caller`'s error when not OK); the serving thread returns at once. `job` must own what
// it uses of the request, or use it only while it runs.
template <typename Job>
void OnBuildPool(const grpc::ServerContext* context, const Answer& answer, absl::string_view method,
                 const ServiceContext& ctx, const std::string& session_id, const Caller& caller,
                 Job job) {
  absl::Status queued = ctx.builds->Run([context, answer, method = std::string(method), session_id,
                                         caller, job = std::move(job)]() mutable {
    const absl::Status status = job();
    if (!status.ok()) LogFailure(method, session_id, context->peer(), status);
    caller.account->CountError(status);
    answer(ToGrpcStatus(status));
  });
  if (!queued.ok()) {
    LogFailure(method, session_id, context->peer(), queued);
    caller.account->CountError(queued);
    answer(ToGrpcStatus(queued));
  }
}

// InSession with `fn` run on the build pool: the serving thread returns at once, and the job
// answers the call. `fn` must own what it uses of the request, or use it only while it runs (the
// job answers the call after it has returned).
template <typename Fn>
void InSessionOnBuildPool(const grpc::ServerContext* context, const Answer& answer,
                          absl::string_view method, const ServiceContext& ctx,
                          const std::string& session_id, Fn fn) {
  absl::StatusOr<Caller> caller = ctx.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, method, "", caller.status());
  absl::StatusOr<std::shared_ptr<Session>> session = ctx.sessions->Get(session_id, *caller);
  if (!session.ok()) return Reply(context, answer, method, session_id, session.status(), &*caller);
  OnBuildPool(context, answer, method, ctx, session_id, *caller,
              [session = *std::move(session), fn = std::move(fn)] { return fn(*session); });
}

absl::Time Deadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// WriteTensor: the chunks are staged as they arrive, each copied once from the received message,
// and go into the tensor's host data together once the client has sent them all (TensorWrite).
class WriteTensorReactor final : public StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  WriteTensorReactor(TensorsService::Chunks* chunks, SessionManager* sessions,
                     absl::StatusOr<Caller> caller, grpc::ByteBuffer* response)
      : StreamReactor(chunks), sessions_(sessions), response_(response) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done sending (or gone)
      if (Cancelled()) {
        // The client went away (or gave up) mid-stream: not a request of the wrong size.
        End(absl::CancelledError(absl::StrCat(
            "WriteTensor: the call was cancelled before the client had sent every chunk",
            write_ == nullptr ? "" : "; nothing was written")));
        return;
      }
      if (write_ == nullptr) {
        End(absl::InvalidArgumentError(
            "WriteTensor: no chunk was sent (the first one names the session and tensor)"));
        return;
      }
      absl::Status status = write_->Finish();
      if (status.ok()) {
        v1::WriteTensorResponse response;
        response.set_bytes_written(write_->bytes_written());
        bool own = false;
        if (!grpc::SerializationTraits<v1::WriteTensorResponse>::Serialize(response, response_,
                                                                           &own)
                 .ok()) {
          status = absl::InternalError("WriteTensor: the response could not be serialized");
        }
      }
      End(status);
      return;
    }
    absl::Status status = v1::wire::ParseTensorChunk(raw_, &chunk_);
    if (!status.ok())
      status = absl::InvalidArgumentError(absl::StrCat("WriteTensor: ", status.message()));
    if (status.ok() && write_ == nullptr) {
      session_id_ = chunk_.fields.session_id();
      absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Get(session_id_, caller_);
      if (session.ok()) {
        absl::StatusOr<std::unique_ptr<TensorWrite>> write =
            TensorWrite::Begin(*std::move(session), chunk_);
        if (write.ok()) {
          write_ = *std::move(write);
        } else {
          status = write.status();
        }
      } else {
        status = session.status();
      }
    } else if (status.ok()) {
      status = write_->Write(chunk_);
    }
    chunk_.data.clear();  // it refers to raw_, which the next read replaces
    if (!status.ok()) {
      End(status);  // the rest of the client's chunks are dropped
      return;
    }
    StartRead(&raw_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    if (!status.ok()) LogFailure("WriteTensor", session_id_, "", status);
    if (caller_.account != nullptr) caller_.account->CountError(status);
    Finish(ToGrpcStatus(status));
  }

  SessionManager* const sessions_;
  grpc::ByteBuffer* const response_;
  Caller caller_;
  std::string session_id_;  // named by the first chunk
  grpc::ByteBuffer raw_;
  TensorWrite::Chunk chunk_;
  std::unique_ptr<TensorWrite> write_;
};

// ReadTensor: one chunk in flight at a time, each a serialized TensorChunk with a copy of its
// part of the tensor's data (TensorRead::Next).
class ReadTensorReactor final : public StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReadTensorReactor(TensorsService::Chunks* chunks, SessionManager* sessions,
                    const absl::StatusOr<Caller>& caller, const grpc::ByteBuffer& raw,
                    uint64_t max_chunk_bytes)
      : StreamReactor(chunks) {
    if (!caller.ok()) {
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    v1::ReadTensorRequest request;
    grpc::ByteBuffer copy(raw);  // shares the slices; Deserialize consumes its argument
    if (!grpc::SerializationTraits<v1::ReadTensorRequest>::Deserialize(&copy, &request).ok()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "ReadTensor: the request is not a komputed.v1.ReadTensorRequest"));
      return;
    }
    absl::StatusOr<std::shared_ptr<Session>> session = sessions->Get(request.session_id(), *caller);
    if (!session.ok()) {
      caller->account->CountError(session.status());
      LogFailure("ReadTensor", request.session_id(), "", session.status());
      Finish(ToGrpcStatus(session.status()));
      return;
    }
    absl::StatusOr<std::unique_ptr<TensorRead>> read =
        TensorRead::Begin(*std::move(session), request, max_chunk_bytes);
    if (!read.ok()) {
      caller->account->CountError(read.status());
      LogFailure("ReadTensor", request.session_id(), "", read.status());
      Finish(ToGrpcStatus(read.status()));
      return;
    }
    read_ = *std::move(read);
    session_id_ = request.session_id();
    account_ = caller->account;
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "ReadTensor: the stream was broken"));
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  void Next() {
    if (read_->done()) {
      Finish(grpc::Status::OK);
      return;
    }
    absl::StatusOr<grpc::ByteBuffer> chunk = read_->Next();
    if (!chunk.ok()) {  // the tensor cannot be read whole
      account_->CountError(chunk.status());
      LogFailure("ReadTensor", session_id_, "", chunk.status());
      Finish(ToGrpcStatus(chunk.status()));
      return;
    }
    chunk_ = *std::move(chunk);
    StartWrite(&chunk_);
  }

  std::unique_ptr<TensorRead> read_;
  std::string session_id_;
  std::shared_ptr<TenantAccount> account_;
  grpc::ByteBuffer chunk_;
};

// Execute: each request runs like Eval; its event is written when it completes.
//
// Backpressure: the stream's window (ServerOptions::execute_window) bounds its evals that are
// being evaluated (pending_) or whose events wait to be written (events_, and the current_events_
// of the write in flight). The next request is read only while the window has room: a full window
// leaves the read unstarted (read_paused_) until a completion or a finished write makes room, so
// that a client that sends without reading its events is held back by gRPC's flow control, and
// the daemon holds at most a window of events per stream, and up to kMaxExecuteBatch - 1 more
// from the request read last.
//
// Batches: a request carries up to kMaxExecuteBatch evals (eval and more_evals), each submitted
// in order as if it had come alone; a client that set batched_events gets the events that are
// ready when a write starts in one message (more_events), within batch_bytes_.
//
// Pipelining: the next read starts (window permitting) before a request's evals run, so that
// gRPC reads it while they are prepared and submitted. The requests read wait in unprocessed_
// and run one at a time, in the order read, on the thread that found none running (processing_).
//
// Lifetime: the reactor owns everything the stream needs and is deleted in OnDone, which gRPC
// calls only after Finish. Finish is called only once (a) the client has stopped sending (half
// close, cancellation or a broken stream all end the reads), (b) every eval read has run and
// completed (pending_ == 0 and !processing_), and (c) no write is outstanding. So every completion
// callback, which points at the reactor, fires while the reactor is alive, and a client that
// disappears mid-stream only makes the remaining events be dropped; the reactor then finishes when
// the last submission completes (bounded by the eval timeout). A paused read is resumed when the
// stream is cancelled (the read then fails at once and ends the reads). The session is held in use
// (so it is not reaped) from the first request until OnDone.
class ExecuteReactor final : public StreamReactor<v1::ExecuteRequest, v1::ExecuteEvent> {
 public:
  ExecuteReactor(StreamOps<v1::ExecuteRequest, v1::ExecuteEvent>* stream, SessionManager* sessions,
                 const Authenticator* auth, const grpc::ServerContext* context,
                 absl::StatusOr<Caller> caller, int window, uint64_t max_message_bytes,
                 Metrics* metrics)
      : StreamReactor(stream),
        sessions_(sessions),
        auth_(auth),
        context_(context),
        window_(window),
        // Events written together stay well inside the daemon's own send limit.
        batch_bytes_(v1::wire::ExecuteBatchBytes(max_message_bytes)),
        queued_bytes_gauge_(&metrics->execute_queued_bytes()),
        requests_read_(&metrics->execute_messages_total("upload")),
        events_written_(&metrics->execute_messages_total("download")),
        evals_(&metrics->execute_evals_total()) {
    if (!caller.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;  // nothing was read or submitted: the stream ends here
      }
      Finish(ToGrpcStatus(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    const uint64_t read_ns = MonotonicNs();  // the evals' "received" stage (stage_times)
    Step next;
    bool process = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        reads_done_ = true;
      } else {
        batched_events_ |= request_.batched_events();
        // The request's evals hold their places in the window from now on; the next read starts
        // at once if the window has room, while this thread (or the one already at it) runs them.
        const size_t evals = 1 + static_cast<size_t>(request_.more_evals_size());
        requests_read_->Increment();
        evals_->Increment(static_cast<double>(evals));
        pending_ += static_cast<int>(evals);
        unprocessed_.push_back({read_ns, std::move(request_)});
        request_.Clear();
        read_paused_ = true;
        process = !processing_;
        processing_ = true;
      }
      next = NextStepLocked();
    }
    Take(next);
    if (!process) return;
    // Runs the requests read so far in the order they were read, until none is left. The stream
    // cannot finish while processing_ is set, so the reactor stays alive until the step decided
    // with its clearing has been taken.
    while (true) {
      std::deque<Unprocessed> work;
      {
        absl::MutexLock lock(&mu_);
        if (unprocessed_.empty()) {
          processing_ = false;
          next = NextStepLocked();
          break;
        }
        work.swap(unprocessed_);
        if (dropping_) {
          // Cancelled or broken: nobody will read their events, so they are not run.
          for (const Unprocessed& w : work) pending_ -= 1 + w.request.more_evals_size();
          continue;
        }
      }
      Process(work);
    }
    Take(next);
  }

  void OnWriteDone(bool ok) override {
    Step next;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      Unqueue(current_bytes_);
      current_bytes_ = 0;
      current_events_ = 0;
      current_.reset();
      if (!ok) Drop();  // the stream is broken: nobody will read further events
      next = NextStepLocked();
    }
    Take(next);
  }

  void OnCancel() override {
    Step next;
    {
      absl::MutexLock lock(&mu_);
      Drop();
      next = NextStepLocked();
    }
    Take(next);
  }

  void OnDone() override { delete this; }  // releases session_

 private:
  // What to do after a change of state: start the next read, write an event, or finish.
  struct Step {
    bool read = false;
    v1::ExecuteEvent* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };
  struct Queued {
    std::shared_ptr<v1::ExecuteEvent> event;
    uint64_t bytes = 0;
  };

  struct Unprocessed {
    uint64_t read_ns = 0;
    v1::ExecuteRequest request;
  };

  // Runs the evals of the requests read so far, in order (each was counted in pending_ when it
  // was read, and Complete takes it out): together, so that those ready at once may go to the
  // device in one submission (Session::EvalMany).
  void Process(const std::deque<Unprocessed>& work) {
    std::vector<EvalPlan> plans;
    std::vector<Session::EvalDone> dones;
    std::shared_ptr<Session> session;  // of plans (one stream's evals all name one session)
    auto run = [&] {
      if (plans.empty()) return;
      session->EvalMany(plans, std::move(dones), [this] {
        absl::MutexLock lock(&mu_);
        return dropping_;  // cancelled or broken meanwhile: nobody will read their events
      });
      plans.clear();
      dones.clear();
    };
    for (const Unprocessed& w : work) {
      const v1::ExecuteRequest& request = w.request;
      const size_t evals = 1 + static_cast<size_t>(request.more_evals_size());
      {
        absl::MutexLock lock(&mu_);
        if (dropping_) {
          // Cancelled or broken meanwhile: nobody will read its events, so it is not run.
          pending_ -= static_cast<int>(evals);
          continue;
        }
      }
      if (evals > v1::wire::kMaxExecuteBatch) {
        const absl::Status refused = absl::InvalidArgumentError(
            absl::StrCat("an Execute request carries ", evals, " evals; at most ",
                         v1::wire::kMaxExecuteBatch, " in one request"));
        LogFailure("Execute", request.eval().session_id(), "", refused);  // once, not per eval
        Refuse(request.eval(), refused);
        for (const v1::EvalRequest& eval : request.more_evals()) Refuse(eval, refused);
        continue;
      }
      // Each request is authenticated again: a token revoked by a reload of the tenants file
      // ends the stream's work from its next request on, not only new calls.
      const absl::StatusOr<Caller> caller = auth_->Authenticate(*context_);
      auto add = [&](const v1::EvalRequest& eval) {
        std::shared_ptr<v1::ExecuteEvent> event = Pend(eval);
        absl::StatusOr<std::shared_ptr<Session>> bound =
            caller.ok() ? Bind(eval.session_id(), *caller) : caller.status();
        if (!bound.ok()) {
          LogFailure("Execute", eval.session_id(), "", bound.status());
          Complete(std::move(event), bound.status());
          return;
        }
        if (*bound != session) run();
        session = *std::move(bound);
        EvalPlan plan = wire::FromWire(eval, session->id());
        plan.received_ns = w.read_ns;
        plans.push_back(std::move(plan));
        dones.push_back(
            [this, event = std::move(event)](absl::StatusOr<EvalResult> result) mutable {
              // session_ is set (Bind) and the reactor alive (pending_) until Complete.
              if (result.ok()) {
                wire::ToWire(*std::move(result), event->mutable_result());
              } else {
                LogFailure("Execute", session_->id(), "", result.status());
              }
              Complete(std::move(event), result.status());
            });
      };
      add(request.eval());
      for (const v1::EvalRequest& eval : request.more_evals()) add(eval);
    }
    run();
  }

  // The event of `eval` (counted in pending_ since its request was read, until Complete).
  static std::shared_ptr<v1::ExecuteEvent> Pend(const v1::EvalRequest& eval) {
    auto event = std::make_shared<v1::ExecuteEvent>();
    event->set_request_id(eval.request_id());
    return event;
  }

  // Answers one eval of a refused request with `why`, running nothing.
  void Refuse(const v1::EvalRequest& eval, const absl::Status& why) { Complete(Pend(eval), why); }

  // The stream belongs to the session that its first request names; later requests name it
  // again or leave session_id empty. Requests are processed one at a time (processing_), so only
  // one thread is here.
  absl::StatusOr<std::shared_ptr<Session>> Bind(const std::string& id, const Caller& caller) {
    if (session_ == nullptr) {
      absl::StatusOr<std::shared_ptr<Session>> session = sessions_->Get(id, caller);
      if (!session.ok()) return session.status();
      session_ = *session;  // in use (never reaped) until the stream is done
      return session;
    }
    if (!id.empty() && id != session_->id()) {
      return absl::InvalidArgumentError(absl::StrCat("this Execute stream belongs to session ",
                                                     session_->id(), "; the request names session ",
                                                     id));
    }
    // The stream holds its session in use from its first request on: while the session is open
    // and the caller's tenant owns it, later evals do not look it up in the daemon's table again
    // (whose lock every call of the daemon takes). A closed one is looked up, for the answer that
    // says why (NOT_FOUND, or FAILED_PRECONDITION with the daemon's reason).
    if (session_->tenant() == caller.tenant() && session_->open()) return session_;
    return sessions_->Get(session_->id(), caller);
  }

  // Called once per submitted eval, on the waiter's thread or inline. Once pending_ drops, another
  // thread may finish the stream (and gRPC then deletes the reactor), so everything happens under
  // one lock acquisition and nothing but the step decided there touches the reactor afterwards.
  void Complete(std::shared_ptr<v1::ExecuteEvent> event, const absl::Status& status) {
    caller_.account->CountError(status);  // set: no eval is submitted before authentication
    if (!status.ok()) {
      event->clear_result();
      event->set_code(static_cast<int32_t>(status.code()));
      event->set_message(std::string(status.message()));
    }
    const uint64_t bytes = event->ByteSizeLong();
    Step next;
    {
      absl::MutexLock lock(&mu_);
      --pending_;
      if (!dropping_) {
        events_.push_back({std::move(event), bytes});
        queued_bytes_gauge_->Increment(static_cast<double>(bytes));
      }
      next = NextStepLocked();
    }
    Take(next);
  }

  void Unqueue(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queued_bytes_gauge_->Decrement(static_cast<double>(bytes));
  }

  void Drop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    dropping_ = true;
    for (const Queued& queued : events_) Unqueue(queued.bytes);
    events_.clear();
  }

  // Whether another request fits in the window. A dropping stream reads on: its reads fail at once.
  bool RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t held = static_cast<size_t>(pending_) + events_.size() + current_events_;
    return dropping_ || held < static_cast<size_t>(window_);
  }

  // Decides the next read (a paused one, once the window has room), the next write, or the finish
  // once nothing remains. read_paused_, writing_ and finished_ make each decided step exclusive:
  // the stream cannot finish (and the reactor cannot go) before the thread that decided it has
  // taken it.
  Step NextStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (finished_) return step;
    if (read_paused_ && RoomLocked()) {
      read_paused_ = false;
      step.read = true;
    }
    if (writing_) return step;
    if (!events_.empty()) {
      writing_ = true;
      current_ = std::move(events_.front().event);
      current_bytes_ = events_.front().bytes;
      events_.pop_front();
      current_events_ = 1;
      // The events that are ready go together to a client that reads batches (each packed one
      // also costs its field's tag and length).
      while (batched_events_ && !events_.empty() && current_events_ < v1::wire::kMaxExecuteBatch &&
             current_bytes_ + current_events_ * v1::wire::kExecuteBatchEntryBytes +
                     events_.front().bytes <=
                 batch_bytes_) {
        current_->add_more_events()->Swap(events_.front().event.get());
        current_bytes_ += events_.front().bytes;
        ++current_events_;
        events_.pop_front();
      }
      step.write = current_.get();
    } else if (reads_done_ && pending_ == 0 && !processing_) {
      finished_ = true;
      step.finish = true;
      if (dropping_)
        step.status = grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled");
    }
    return step;
  }

  // Makes the gRPC calls that NextStepLocked decided, outside the lock. (A read and a write may
  // both be decided: neither lets the stream finish before the other has started.)
  void Take(const Step& step) {
    if (step.write != nullptr) {
      events_written_->Increment();
      StartWrite(step.write);
    }
    if (step.read) StartRead(&request_);
    if (step.finish) Finish(step.status);
  }

  SessionManager* const sessions_;
  const Authenticator* const auth_;
  const grpc::ServerContext* const context_;  // valid until OnDone
  const int window_;
  const uint64_t batch_bytes_;                   // bytes of the events written together, at most
  prometheus::Gauge* const queued_bytes_gauge_;  // komputed_execute_queued_bytes, all streams
  prometheus::Counter* const requests_read_;     // komputed_execute_messages_total
  prometheus::Counter* const events_written_;
  prometheus::Counter* const evals_;  // komputed_execute_evals_total
  Caller caller_;                     // as the stream opened: counts its errors
  v1::ExecuteRequest request_;        // the read in progress
  std::shared_ptr<Session> session_;  // set by the first request that names a session

  absl::Mutex mu_;
  // Evals read whose event is not queued yet: those still to run, and those submitted.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Unprocessed> unprocessed_ ABSL_GUARDED_BY(mu_);  // requests read, in order
  bool processing_ ABSL_GUARDED_BY(mu_) = false;              // a thread runs unprocessed_
  std::deque<Queued> events_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::ExecuteEvent> current_ ABSL_GUARDED_BY(mu_);  // the write in flight
  uint64_t current_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t current_events_ ABSL_GUARDED_BY(mu_) = 0;  // in the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;  // the next read waits for room in the window
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool dropping_ ABSL_GUARDED_BY(mu_) = false;  // cancelled or broken: events are dropped
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool batched_events_ ABSL_GUARDED_BY(mu_) = false;  // the client reads more_events
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Devices

void DevicesService::ServeListDevices(grpc::ServerContext* context, const v1::ListDevicesRequest*,
                                      v1::ListDevicesResponse* response, Answer answer) {
  for (size_t i = 0; i < ctx_.pool->size(); ++i) {
    wire::ToWire(ctx_.pool->at(i), response->add_devices());
  }
  return Reply(context, answer, "ListDevices", "", absl::OkStatus());
}

void DevicesService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &DevicesService::RequestListDevices, &DevicesService::ServeListDevices);
}

// ---------------------------------------------------------------------------------------------
// Sessions

void SessionsService::ServeOpenSession(grpc::ServerContext* context,
                                       const v1::OpenSessionRequest* request,
                                       v1::OpenSessionResponse* response, Answer answer) {
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, "OpenSession", "", caller.status());
  OpenRequest open = wire::FromWire(*request, context->peer());
  open.caller = *caller;
  absl::StatusOr<std::shared_ptr<Session>> session = ctx_.sessions->Open(std::move(open));
  if (!session.ok()) return Reply(context, answer, "OpenSession", "", session.status(), &*caller);
  response->set_session_id((*session)->id());
  wire::ToWire((*session)->device(), response->mutable_device());
  response->set_queue_count((*session)->queue_count());
  response->set_idle_timeout_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(ctx_.options->session_idle_timeout)));
  response->set_max_message_bytes(static_cast<uint64_t>(ctx_.options->max_message_bytes));
  response->set_direct_address(ctx_.options->advertise_address);
  response->set_execute_batches(true);
  if (!(*session)->shared_memory_ticket().empty()) {
    response->set_shared_memory_socket(ctx_.sessions->shared_memory_socket());
    response->set_shared_memory_ticket((*session)->shared_memory_ticket());
  }
  return Reply(context, answer, "OpenSession", (*session)->id(), absl::OkStatus());
}

void SessionsService::ServeCloseSession(grpc::ServerContext* context,
                                        const v1::CloseSessionRequest* request,
                                        v1::CloseSessionResponse*, Answer answer) {
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, "CloseSession", "", caller.status());
  return Reply(context, answer, "CloseSession", request->session_id(),
               ctx_.sessions->Close(request->session_id(), *caller), &*caller);
}

void SessionsService::ServeKeepAlive(grpc::ServerContext* context,
                                     const v1::KeepAliveRequest* request, v1::KeepAliveResponse*,
                                     Answer answer) {
  InSession(context, answer, "KeepAlive", ctx_, request->session_id(),
            [](Session&) { return absl::OkStatus(); });
}

void SessionsService::ServeListSessions(grpc::ServerContext* context,
                                        const v1::ListSessionsRequest* request,
                                        v1::ListSessionsResponse* response, Answer answer) {
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, "ListSessions", "", caller.status());
  for (const auto& session : ctx_.sessions->List(*caller)) {
    v1::SessionInfo* info = response->add_sessions();
    wire::ToWire(session->Describe(), info);
    // An admin sees other tenants' sessions, but not the ids that would let it act in them,
    // unless it asks.
    if (session->tenant() != caller->tenant() && !request->include_ids()) info->clear_session_id();
  }
  return Reply(context, answer, "ListSessions", "", absl::OkStatus());
}

void SessionsService::ServePing(grpc::ServerContext* context, const v1::PingRequest* request,
                                v1::PingResponse* response, Answer answer) {
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, "Ping", "", caller.status());
  response->set_payload(request->payload());
  answer(grpc::Status::OK);
}

void SessionsService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &SessionsService::RequestOpenSession, &SessionsService::ServeOpenSession);
  queue.AddUnary(this, &SessionsService::RequestCloseSession, &SessionsService::ServeCloseSession);
  queue.AddUnary(this, &SessionsService::RequestKeepAlive, &SessionsService::ServeKeepAlive);
  queue.AddUnary(this, &SessionsService::RequestListSessions, &SessionsService::ServeListSessions);
  queue.AddUnary(this, &SessionsService::RequestPing, &SessionsService::ServePing,
                 CallQueue::Serving::kQuick);
}

// ---------------------------------------------------------------------------------------------
// Tensors

void TensorsService::ServeCreateTensor(grpc::ServerContext* context,
                                       const v1::CreateTensorRequest* request,
                                       v1::CreateTensorResponse*, Answer answer) {
  // `request` (and the data that the TensorRequest refers to) lives until the call is finished,
  // which the job does once it has created the tensor.
  auto create = [request](Session& s) -> absl::Status {
    absl::StatusOr<TensorRequest> tensor = wire::FromWire(*request);
    if (!tensor.ok()) return tensor.status();
    return s.CreateTensor(*tensor);
  };
  if (request->count() >= kBuildPoolTensorElements) {
    return InSessionOnBuildPool(context, answer, "CreateTensor", ctx_, request->session_id(),
                                create);
  }
  InSession(context, answer, "CreateTensor", ctx_, request->session_id(), create);
}

void TensorsService::ServeDestroyTensor(grpc::ServerContext* context,
                                        const v1::DestroyTensorRequest* request,
                                        v1::DestroyTensorResponse*, Answer answer) {
  InSession(context, answer, "DestroyTensor", ctx_, request->session_id(),
            [&](Session& s) { return s.DestroyTensor(request->handle()); });
}

StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TensorsService::ServeWriteTensor(
    grpc::ServerContext* context, grpc::ByteBuffer* response, Chunks* chunks) {
  return new WriteTensorReactor(chunks, ctx_.sessions, ctx_.auth->Authenticate(*context), response);
}

StreamReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TensorsService::ServeReadTensor(
    grpc::ServerContext* context, const grpc::ByteBuffer* request, Chunks* chunks) {
  const uint64_t max_message = static_cast<uint64_t>(ctx_.options->max_message_bytes);
  const uint64_t max_chunk =
      max_message > 2 * kChunkOverhead ? max_message - kChunkOverhead : kChunkOverhead;
  return new ReadTensorReactor(chunks, ctx_.sessions, ctx_.auth->Authenticate(*context), *request,
                               max_chunk);
}

void TensorsService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &TensorsService::RequestCreateTensor, &TensorsService::ServeCreateTensor);
  queue.AddUnary(this, &TensorsService::RequestDestroyTensor, &TensorsService::ServeDestroyTensor);
  queue.AddClientStream(this, &TensorsService::RequestWriteTensor,
                        &TensorsService::ServeWriteTensor);
  queue.AddServerStream(this, &TensorsService::RequestReadTensor, &TensorsService::ServeReadTensor);
}

// ---------------------------------------------------------------------------------------------
// Algorithms

void AlgorithmsService::ServeCreateAlgorithm(grpc::ServerContext* context,
                                             const v1::CreateAlgorithmRequest* request,
                                             v1::CreateAlgorithmResponse*, Answer answer) {
  InSessionOnBuildPool(
      context, answer, "CreateAlgorithm", ctx_, request->session_id(),
      [request = wire::FromWire(*request)](Session& s) { return s.CreateAlgorithm(request); });
}

void AlgorithmsService::ServeRebuildAlgorithm(grpc::ServerContext* context,
                                              const v1::CreateAlgorithmRequest* request,
                                              v1::CreateAlgorithmResponse*, Answer answer) {
  InSessionOnBuildPool(
      context, answer, "RebuildAlgorithm", ctx_, request->session_id(),
      [request = wire::FromWire(*request)](Session& s) { return s.RebuildAlgorithm(request); });
}

void AlgorithmsService::ServeSetPushConstants(grpc::ServerContext* context,
                                              const v1::SetPushConstantsRequest* request,
                                              v1::SetPushConstantsResponse*, Answer answer) {
  InSession(context, answer, "SetPushConstants", ctx_, request->session_id(),
            [&](Session& s) { return s.SetPushConstants(wire::FromWire(*request)); });
}

void AlgorithmsService::ServeDestroyAlgorithm(grpc::ServerContext* context,
                                              const v1::DestroyAlgorithmRequest* request,
                                              v1::DestroyAlgorithmResponse*, Answer answer) {
  InSession(context, answer, "DestroyAlgorithm", ctx_, request->session_id(),
            [&](Session& s) { return s.DestroyAlgorithm(request->handle()); });
}

void AlgorithmsService::ServeCompileGlsl(grpc::ServerContext* context,
                                         const v1::CompileGlslRequest* request,
                                         v1::CompileGlslResponse* response, Answer answer) {
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return Reply(context, answer, "CompileGlsl", "", caller.status());
  // Bounded as an algorithm's GLSL (the tenant's source_bytes), before anything is compiled.
  absl::Status size =
      caller->account->CheckSize(&Quota::source_bytes, request->glsl().size(),
                                 absl::StrCat("GLSL of ", request->glsl().size(), " bytes"));
  if (!size.ok()) return Reply(context, answer, "CompileGlsl", "", size, &*caller);
  // Compiled on the build pool, within the daemon's GLSL limits, as CreateAlgorithm's GLSL.
  // `request` and `response` live until the job finishes the call.
  OnBuildPool(context, answer, "CompileGlsl", ctx_, "", *caller, [ctx = ctx_, request, response] {
    absl::StatusOr<std::vector<uint32_t>> spirv = CompileClientGlsl(
        ctx.options->glsl_compiler, ctx.options->glsl_limits, request->glsl(), "compileSource");
    ctx.metrics->shader_compilations_total(spirv.ok() ? "ok" : "error").Increment();
    if (!spirv.ok()) return spirv.status();
    response->set_spirv(reinterpret_cast<const char*>(spirv->data()),
                        spirv->size() * sizeof(uint32_t));
    return absl::OkStatus();
  });
}

void AlgorithmsService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &AlgorithmsService::RequestCreateAlgorithm,
                 &AlgorithmsService::ServeCreateAlgorithm);
  queue.AddUnary(this, &AlgorithmsService::RequestRebuildAlgorithm,
                 &AlgorithmsService::ServeRebuildAlgorithm);
  queue.AddUnary(this, &AlgorithmsService::RequestSetPushConstants,
                 &AlgorithmsService::ServeSetPushConstants);
  queue.AddUnary(this, &AlgorithmsService::RequestDestroyAlgorithm,
                 &AlgorithmsService::ServeDestroyAlgorithm);
  queue.AddUnary(this, &AlgorithmsService::RequestCompileGlsl,
                 &AlgorithmsService::ServeCompileGlsl);
}

// ---------------------------------------------------------------------------------------------
// Sequences

void SequencesService::ServeCreateSequence(grpc::ServerContext* context,
                                           const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse*, Answer answer) {
  InSession(context, answer, "CreateSequence", ctx_, request->session_id(),
            [&](Session& s) { return s.CreateSequence(wire::FromWire(*request)); });
}

void SequencesService::ServeRecord(grpc::ServerContext* context, const v1::RecordRequest* request,
                                   v1::RecordResponse*, Answer answer) {
  InSession(context, answer, "Record", ctx_, request->session_id(),
            [&](Session& s) -> absl::Status {
              absl::StatusOr<RecordRequest> record = wire::FromWire(*request);
              if (!record.ok()) return record.status();
              return s.Record(*record);
            });
}

void SequencesService::ServeEval(grpc::ServerContext* context, const v1::EvalRequest* request,
                                 v1::EvalResponse* response, Answer finish) {
  const uint64_t received_ns = request->stage_times() ? MonotonicNs() : 0;
  auto fail = [&](const std::string& session_id, const absl::Status& status, const Caller* caller) {
    LogFailure("Eval", session_id, context->peer(), status);
    if (caller != nullptr) caller->account->CountError(status);
    finish(ToGrpcStatus(status));
  };
  absl::StatusOr<Caller> caller = ctx_.auth->Authenticate(*context);
  if (!caller.ok()) return fail("", caller.status(), nullptr);
  absl::StatusOr<std::shared_ptr<Session>> found =
      ctx_.sessions->Get(request->session_id(), *caller);
  if (!found.ok()) return fail(request->session_id(), found.status(), &*caller);
  std::shared_ptr<Session> session = *std::move(found);  // alive until Eval has returned
  // The callback holds the session in use (not reaped) until the eval has completed. `request`
  // lives until the call is finished, which the callback does last.
  auto eval = [context, request, response, finish, session, received_ns,
               account = caller->account](bool may_wait_inline) {
    EvalPlan plan = wire::FromWire(*request, session->id());
    plan.received_ns = received_ns;
    session->Eval(plan, Deadline(*context), may_wait_inline,
                  [finish, session, response, account](absl::StatusOr<EvalResult> result) mutable {
                    if (result.ok()) {
                      wire::ToWire(*std::move(result), response);
                    } else {
                      LogFailure("Eval", session->id(), "", result.status());
                      account->CountError(result.status());
                    }
                    session.reset();
                    finish(ToGrpcStatus(result.status()));
                  });
  };
  if (!CreatesLargeTensor(*request)) {
    eval(/*may_wait_inline=*/true);
    return;
  }
  // Large tensors are created off the serving thread (kBuildPoolTensorElements), and the eval
  // with them.
  absl::Status queued = ctx_.builds->Run([eval] { eval(/*may_wait_inline=*/false); });
  if (!queued.ok()) fail(request->session_id(), queued, &*caller);
}

void SequencesService::ServeDestroySequence(grpc::ServerContext* context,
                                            const v1::DestroySequenceRequest* request,
                                            v1::DestroySequenceResponse*, Answer answer) {
  InSession(context, answer, "DestroySequence", ctx_, request->session_id(),
            [&](Session& s) { return s.DestroySequence(request->handle()); });
}

void SequencesService::ServeGetTimestamps(grpc::ServerContext* context,
                                          const v1::GetTimestampsRequest* request,
                                          v1::GetTimestampsResponse* response, Answer answer) {
  InSession(context, answer, "GetTimestamps", ctx_, request->session_id(), [&](Session& s) {
    absl::StatusOr<std::vector<uint64_t>> timestamps = s.GetTimestamps(request->handle());
    if (!timestamps.ok()) return timestamps.status();
    for (uint64_t t : *timestamps) response->add_timestamps_ns(t);
    return absl::OkStatus();
  });
}

StreamReactor<v1::ExecuteRequest, v1::ExecuteEvent>* SequencesService::ServeExecute(
    grpc::ServerContext* context, StreamOps<v1::ExecuteRequest, v1::ExecuteEvent>* stream) {
  return new ExecuteReactor(stream, ctx_.sessions, ctx_.auth, context,
                            ctx_.auth->Authenticate(*context), ctx_.options->execute_window,
                            static_cast<uint64_t>(ctx_.options->max_message_bytes), ctx_.metrics);
}

void SequencesService::AddTo(CallQueue& queue) {
  queue.AddUnary(this, &SequencesService::RequestCreateSequence,
                 &SequencesService::ServeCreateSequence);
  queue.AddUnary(this, &SequencesService::RequestRecord, &SequencesService::ServeRecord);
  queue.AddUnary(this, &SequencesService::RequestEval, &SequencesService::ServeEval,
                 CallQueue::Serving::kQuickPolls);
  queue.AddUnary(this, &SequencesService::RequestDestroySequence,
                 &SequencesService::ServeDestroySequence);
  queue.AddUnary(this, &SequencesService::RequestGetTimestamps,
                 &SequencesService::ServeGetTimestamps);
  queue.AddBidiStream(this, &SequencesService::RequestExecute, &SequencesService::ServeExecute);
}

}  // namespace komputed::server
