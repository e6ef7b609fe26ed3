#pragma once
// Every gRPC call of the daemon, served on gRPC's completion-queue API by threads of komputed's
// own.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace komputed::server {

// How a unary call is answered: called once, from any thread, after the response has been filled.
// The call's context, request and response live until then.
using Answer = std::function<void(const grpc::Status&)>;

// A streaming call's operations, as its reactor starts them (from any thread): a read (calls
// whose client streams), a write (calls whose server streams), each at most one at a time, and
// the finish, once. A client-streaming call's response is sent with an OK finish.
template <typename Request, typename Response>
class StreamOps {
 public:
  virtual void Read(Request* request) = 0;
  virtual void Write(const Response* response) = 0;
  virtual void Finish(const grpc::Status& status) = 0;
  // Whether the call is known to be cancelled (its OnCancel has begun; for a client-streaming
  // call, also from its failed read's reaction on).
  virtual bool Cancelled() const = 0;

 protected:
  ~StreamOps() = default;
};

// A streaming call's reactions, in the shape of gRPC's callback reactors: each operation's
// completion, the call's cancellation (client gone, deadline past, server shutting down), and
// OnDone last, once the finish has completed and every operation started has completed (the
// reactor deletes itself there). A read's and a write's reactions may run at the same time, on
// different threads; OnCancel may run beside either.
template <typename Request, typename Response>
class StreamReactor {
 public:
  virtual ~StreamReactor() = default;
  virtual void OnReadDone(bool /*ok*/) {}
  virtual void OnWriteDone(bool /*ok*/) {}
  virtual void OnCancel() {}
  virtual void OnDone() = 0;

 protected:
  // `ops` outlives the reactor; operations may be started in the constructor.
  explicit StreamReactor(StreamOps<Request, Response>* ops) : ops_(ops) {}
  void StartRead(Request* request) { ops_->Read(request); }
  void StartWrite(const Response* response) { ops_->Write(response); }
  void Finish(const grpc::Status& status) { ops_->Finish(status); }
  // A failed read is either the client's half close or the call's end: this tells them apart
  // (a client-streaming call's failed read always knows; elsewhere once OnCancel has begun).
  bool Cancelled() const { return ops_->Cancelled(); }

 private:
  StreamOps<Request, Response>* const ops_;
};

// The callback API hands each call from the thread that read it to another one, and its threads
// do the reading for every call of the server (Debian's gRPC 1.51): a server with any callback
// method pays that hand-off on every call. Here every method is served from one queue, whose
// threads read the connections themselves. And a thread that has just answered a call of a
// polling method (Eval) looks at the queue without sleeping for `poll` before it blocks (one
// thread at a time), so that a client's next call finds it awake instead of waking it tens of
// microseconds late. Polling costs that thread's core for up to `poll` after each such call; zero
// turns it off.
//
// The handlers must not block (the queue has few threads): device waits finish their call later,
// from the device's completion waiter.
//
// One thread at a time holds the queue (waits in it, or serves an event it took while keeping it);
// the others wait for it on a mutex. With several threads waiting in one gRPC queue, gRPC 1.51
// hands its poller's role to another of them with a futex wake on every event, before the event
// is served: a cost on every call's path. Here the thread that took an event hands the queue on
// before serving it, unless the event is short and never waits (a Serving::kQuick call, the
// answer of any unary call), and a kQuickPolls call (Eval) hands it on only where it is about to
// wait for the device (WillWait), so that the device's time covers the hand-off.
//
// Lifetime: made before the server is built (it adds its queue to the builder); the methods are
// added before Start, which comes after the server has started; Shutdown after the server's
// Shutdown has returned. A call still being answered then (an eval on the device or the build
// pool, a stream that gRPC cancelled) is waited for: the queue is shut down only once every call
// asked for has come back (refused by the server's shutdown, or arrived, answered and deleted),
// and no call is asked for after Shutdown has begun.
// The services outlive it.
class CallQueue {
 public:
  // How a unary method's calls are served (AddUnary).
  enum class Serving {
    kHandsOn,     // may take long: the queue goes to another thread before the call is served
    kQuick,       // short, never waits: served by the thread that took it, which keeps the queue
    kQuickPolls,  // as kQuick until it waits (WillWait), and an answered call starts the thread's
                  // polling for the next (Eval)
  };
  // A unary request larger than this is served as kHandsOn whatever its method (its bytes take
  // time to copy).
  static constexpr size_t kQuickRequestBytes = 64 << 10;

  // Called by a handler on a serving thread just before it waits (for the device): if the thread
  // holds the queue, another takes it. Nothing elsewhere.
  static void WillWait();
  // Called by a handler on a serving thread that would rather wait a short while keeping the queue
  // (then WillWait before it waits longer): whether it may. Not where the thread does not hold the
  // queue, nor for `hold_off` (the constructor's) after a thread that kept it so found an event of
  // another client's call (another peer) waiting behind it: where several clients are at work,
  // the hand-off lets their calls go on meanwhile. (Clients of a Unix socket may all share one
  // peer name: there only the hold's bound applies.)
  static bool MayHold();

  CallQueue(grpc::ServerBuilder& builder, int threads, absl::Duration poll,
            absl::Duration hold_off = absl::Milliseconds(20));
  ~CallQueue();
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  // The generated Request<Method> of an async (or raw) method of each kind.
  template <typename Base, typename Request, typename Response>
  using AskUnary = void (Base::*)(grpc::ServerContext*, Request*,
                                  grpc::ServerAsyncResponseWriter<Response>*,
                                  grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);
  template <typename Base, typename Request, typename Response>
  using AskClientStream = void (Base::*)(grpc::ServerContext*,
                                         grpc::ServerAsyncReader<Response, Request>*,
                                         grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                         void*);
  template <typename Base, typename Request, typename Response>
  using AskServerStream = void (Base::*)(grpc::ServerContext*, Request*,
                                         grpc::ServerAsyncWriter<Response>*, grpc::CompletionQueue*,
                                         grpc::ServerCompletionQueue*, void*);
  template <typename Base, typename Request, typename Response>
  using AskBidiStream = void (Base::*)(grpc::ServerContext*,
                                       grpc::ServerAsyncReaderWriter<Response, Request>*,
                                       grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*);

  // A unary method: `serve` answers each call (through its Answer).
  template <typename Service, typename Base, typename Request, typename Response>
  void AddUnary(Service* service, AskUnary<Base, Request, Response> ask,
                void (Service::*serve)(grpc::ServerContext*, const Request*, Response*, Answer),
                Serving serving = Serving::kHandsOn);
  // A client-streaming method: `serve` makes each call's reactor; the response is sent with an OK
  // finish.
  template <typename Service, typename Base, typename Request, typename Response>
  void AddClientStream(Service* service, AskClientStream<Base, Request, Response> ask,
                       StreamReactor<Request, Response>* (Service::*serve)(
                           grpc::ServerContext*, Response*, StreamOps<Request, Response>*));
  // A server-streaming method (reads are not started on it).
  template <typename Service, typename Base, typename Request, typename Response>
  void AddServerStream(Service* service, AskServerStream<Base, Request, Response> ask,
                       StreamReactor<Request, Response>* (Service::*serve)(
                           grpc::ServerContext*, const Request*, StreamOps<Request, Response>*));
  template <typename Service, typename Base, typename Request, typename Response>
  void AddBidiStream(Service* service, AskBidiStream<Base, Request, Response> ask,
                     StreamReactor<Request, Response>* (Service::*serve)(
                         grpc::ServerContext*, StreamOps<Request, Response>*));

  void Start();
  // Waits for the calls still being answered, shuts the queue down and joins the threads;
  // idempotent.
  void Shutdown();

  // What a call's events on the queue are (each call's tags point at one of its Tag members).
  enum class Op { kArrived, kRead, kProbe, kWrite, kFinish, kDone };
  class Call;
  struct Tag {
    Call* call;
    Op op;
  };
  // A call of a method: asked for (its request not yet arrived), then being answered; deleted
  // through Release once its last event is in.
  class Call {
   public:
    virtual ~Call() = default;
    // One of its events (ok as the queue gave it).
    virtual void Proceed(Op op, bool ok) = 0;
    // Whether an answered call of its method starts the thread's polling for the next call.
    virtual bool polls() const { return false; }
    // Whether the thread that took this event may serve it keeping the queue (short work that
    // never waits, or hands the queue on itself before it does: WillWait).
    virtual bool keeps_queue(Op /*op*/, bool /*ok*/) const { return false; }
    // Its client's address (gRPC's peer), once it has arrived.
    virtual std::string peer() const = 0;
  };
  // A method: asks gRPC for its next call.
  class Method {
   public:
    virtual ~Method() = default;
    virtual void Ask(CallQueue& queue) = 0;
  };

  // For the calls: a call's arrival (the next call of its method is asked for, and counted until
  // its Release), and its deletion.
  void Arrived(Method& method);
  void Release(Call* call);

 private:
  // A serving thread's hold on the queue.
  struct Holder {
    CallQueue* queue;
    bool holds = false;
    Call* call = nullptr;    // the call whose event it serves
    bool held_wait = false;  // that event waited keeping the queue (MayHold)
    std::string held_peer;   // and that call's client
  };
  void Serve();
  void Take(Holder& self);
  void HandOn(Holder& self);

  const int thread_count_;
  const absl::Duration poll_;
  const absl::Duration hold_off_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::unique_ptr<Method>> methods_;
  std::vector<std::thread> threads_;
  // Until when (steady clock, ns) the thread that holds the queue polls it instead of sleeping:
  // the polling window of the last answered polling call.
  std::atomic<int64_t> poll_until_ns_{0};
  // Until when (steady clock, ns) MayHold says no.
  std::atomic<int64_t> hold_off_until_ns_{0};
  absl::Mutex hold_mu_;
  bool held_ ABSL_GUARDED_BY(hold_mu_) = false;     // a thread holds the queue
  bool drained_ ABSL_GUARDED_BY(hold_mu_) = false;  // the queue is shut down and empty
  static thread_local Holder* serving_;             // this thread's hold while it serves an event
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown has begun: no call is asked for
  // Calls asked for or being answered, not yet deleted: an event on the queue may belong to any.
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ = false;
};

// ---------------------------------------------------------------------------------------------
// Implementation of the templates.

namespace call_queue_internal {

template <typename Request, typename Response>
class UnaryMethod final : public CallQueue::Method {
 public:
  using AskFn = std::function<void(grpc::ServerContext*, Request*,
                                   grpc::ServerAsyncResponseWriter<Response>*, void* tag)>;
  using ServeFn = std::function<void(grpc::ServerContext*, const Request*, Response*, Answer)>;
  UnaryMethod(AskFn ask, ServeFn serve, CallQueue::Serving serving)
      : ask_(std::move(ask)), serve_(std::move(serve)), serving_(serving) {}
  void Ask(CallQueue& queue) override;

 private:
  class Call;
  const AskFn ask_;
  const ServeFn serve_;
  const CallQueue::Serving serving_;
};

template <typename Request, typename Response>
class UnaryMethod<Request, Response>::Call final : public CallQueue::Call {
 public:
  Call(CallQueue& queue, UnaryMethod& method) : queue_(queue), method_(method) {
    method.ask_(&context_, &request_, &responder_, &arrived_);
  }
  void Proceed(CallQueue::Op op, bool ok) override {
    if (op == CallQueue::Op::kFinish) {  // answered, whether or not it reached the client
      queue_.Release(this);
      return;
    }
    if (!ok) {  // asked for, and will not come: the server is shutting down
      queue_.Release(this);
      return;
    }
    queue_.Arrived(method_);
    method_.serve_(&context_, &request_, &response_, [this](const grpc::Status& status) {
      responder_.Finish(response_, status, &finished_);
    });
  }
  bool polls() const override { return method_.serving_ == CallQueue::Serving::kQuickPolls; }
  std::string peer() const override { return context_.peer(); }
  bool keeps_queue(CallQueue::Op op, bool ok) const override {
    // The answer's event and a call that will not come only delete the call.
    if (op != CallQueue::Op::kArrived || !ok) return true;
    return method_.serving_ != CallQueue::Serving::kHandsOn &&
           request_.ByteSizeLong() <= CallQueue::kQuickRequestBytes;
  }

 private:
  CallQueue& queue_;
  UnaryMethod& method_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_{&context_};
  CallQueue::Tag arrived_{this, CallQueue::Op::kArrived};
  CallQueue::Tag finished_{this, CallQueue::Op::kFinish};
};

template <typename Request, typename Response>
void UnaryMethod<Request, Response>::Ask(CallQueue& queue) {
  new Call(queue, *this);
}

// The three streaming kinds differ in how a call is asked for and finished, and in which
// operations they have: Stream is gRPC's async stream object of the kind.
template <typename Request, typename Response, typename Stream>
class StreamMethod final : public CallQueue::Method {
 public:
  static constexpr bool kClientStreams =
      std::is_same_v<Stream, grpc::ServerAsyncReader<Response, Request>>;
  static constexpr bool kServerStreams = std::is_same_v<Stream, grpc::ServerAsyncWriter<Response>>;
  // Server streaming: the request arrives with the call (null otherwise).
  using AskFn = std::function<void(grpc::ServerContext*, Request*, Stream*, void* tag)>;
  using ServeFn = std::function<StreamReactor<Request, Response>*(
      grpc::ServerContext*, Request*, Response*, StreamOps<Request, Response>*)>;
  StreamMethod(AskFn ask, ServeFn serve) : ask_(std::move(ask)), serve_(std::move(serve)) {}
  void Ask(CallQueue& queue) override;

 private:
  class Call;
  const AskFn ask_;
  const ServeFn serve_;
};

template <typename Request, typename Response, typename Stream>
class StreamMethod<Request, Response, Stream>::Call final : public CallQueue::Call,
                                                            public StreamOps<Request, Response> {
 public:
  Call(CallQueue& queue, StreamMethod& method) : queue_(queue), method_(method) {
    // Before the call is asked for, as gRPC requires: its kDone event comes once the call has
    // ended (finished, or cancelled).
    context_.AsyncNotifyWhenDone(&done_);
    method.ask_(&context_, kServerStreams ? &request_ : nullptr, &stream_, &arrived_);
  }

  void Proceed(CallQueue::Op op, bool ok) override {
    switch (op) {
      case CallQueue::Op::kArrived:
        if (!ok) {  // asked for, and will not come: the server is shutting down
          queue_.Release(this);
          return;
        }
        queue_.Arrived(method_);
        {
          absl::MutexLock lock(&mu_);
          ++outstanding_;  // the kDone event
        }
        Bind(method_.serve_(&context_, &request_, &response_, this));
        return;
      case CallQueue::Op::kRead:
        if constexpr (kClientStreams) {
          bool finishing = false;
          {
            absl::MutexLock lock(&mu_);
            finishing = finishing_;
          }
          if (!ok && !finishing) {
            // The client's half close, or the call's end? gRPC tells the async API of a
            // cancellation only through kDone, which may come later. Sending the initial metadata
            // (not sent yet: this kind writes nothing before its finish) fails on an ended call
            // and succeeds on a half-closed one; the read's reaction waits for it.
            stream_.SendInitialMetadata(&probed_);
            return;
          }
        }
        reactor_->OnReadDone(ok);
        break;
      case CallQueue::Op::kProbe:  // stands for the failed read
        if (!ok) cancelled_.store(true);
        reactor_->OnReadDone(false);
        break;
      case CallQueue::Op::kWrite:
        reactor_->OnWriteDone(ok);
        break;
      case CallQueue::Op::kFinish:
        break;
      case CallQueue::Op::kDone: {
        bool early = false;
        {
          absl::MutexLock lock(&mu_);
          early = reactor_ == nullptr;
          done_early_ = early;
        }
        if (early) return;  // cancelled while the method made the reactor: Bind goes on
        if (context_.IsCancelled()) {
          cancelled_.store(true);
          reactor_->OnCancel();
        }
        break;
      }
    }
    // Each reaction has run before its operation stops counting: OnDone cannot overtake it.
    bool last = false;
    {
      absl::MutexLock lock(&mu_);
      --outstanding_;
      if (op == CallQueue::Op::kFinish) finish_done_ = true;
      last = finish_done_ && outstanding_ == 0;
    }
    if (!last) return;
    reactor_->OnDone();
    queue_.Release(this);
  }

  void Read(Request* request) override {
    if constexpr (!kServerStreams) {
      {
        absl::MutexLock lock(&mu_);
        ++outstanding_;
        if (reactor_ == nullptr) {
          deferred_read_ = request;
          return;
        }
      }
      stream_.Read(request, &read_);
    }
  }
  void Write(const Response* response) override {
    if constexpr (!kClientStreams) {
      {
        absl::MutexLock lock(&mu_);
        ++outstanding_;
        if (reactor_ == nullptr) {
          deferred_write_ = response;
          return;
        }
      }
      stream_.Write(*response, &written_);
    }
  }
  void Finish(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      ++outstanding_;
      finishing_ = true;
      if (reactor_ == nullptr) {
        deferred_finish_ = status;
        return;
      }
    }
    FinishNow(status);
  }
  bool Cancelled() const override { return cancelled_.load(); }
  std::string peer() const override { return context_.peer(); }

 private:
  // The reactor's constructor may start operations: they are started once it is bound, so that
  // no reaction reaches a reactor still being constructed.
  void Bind(StreamReactor<Request, Response>* reactor) {
    Request* read = nullptr;
    const Response* write = nullptr;
    std::optional<grpc::Status> finish;
    bool done = false;
    {
      absl::MutexLock lock(&mu_);
      reactor_ = reactor;
      done = done_early_;
      read = std::exchange(deferred_read_, nullptr);
      write = std::exchange(deferred_write_, nullptr);
      finish = std::exchange(deferred_finish_, std::nullopt);
    }
    if constexpr (!kServerStreams) {
      if (read != nullptr) stream_.Read(read, &read_);
    }
    if constexpr (!kClientStreams) {
      if (write != nullptr) stream_.Write(*write, &written_);
    }
    if (finish.has_value()) FinishNow(*finish);
    if (done) Proceed(CallQueue::Op::kDone, true);
  }

  void FinishNow(const grpc::Status& status) {
    if constexpr (kClientStreams) {
      if (status.ok()) {
        stream_.Finish(response_, status, &finished_);
      } else {
        stream_.FinishWithError(status, &finished_);
      }
    } else {
      stream_.Finish(status, &finished_);
    }
  }

  CallQueue& queue_;
  StreamMethod& method_;
  grpc::ServerContext context_;
  Request request_;    // server streaming: the call's request
  Response response_;  // client streaming: the call's response
  Stream stream_{&context_};
  // Deletes itself in OnDone. Set (under mu_) once the method has made it; the events of the
  // operations, which read it, come only after that, and an early kDone is taken by Bind.
  StreamReactor<Request, Response>* reactor_ = nullptr;
  CallQueue::Tag arrived_{this, CallQueue::Op::kArrived};
  CallQueue::Tag read_{this, CallQueue::Op::kRead};
  CallQueue::Tag probed_{this, CallQueue::Op::kProbe};
  CallQueue::Tag written_{this, CallQueue::Op::kWrite};
  CallQueue::Tag finished_{this, CallQueue::Op::kFinish};
  CallQueue::Tag done_{this, CallQueue::Op::kDone};
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // operations started whose events are not in
  bool finish_done_ ABSL_GUARDED_BY(mu_) = false;
  // The reactor has finished: a failed read is then not probed (the finish sends the initial
  // metadata).
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  // Started by the reactor's constructor, before it was bound.
  Request* deferred_read_ ABSL_GUARDED_BY(mu_) = nullptr;
  const Response* deferred_write_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);
  bool done_early_ ABSL_GUARDED_BY(mu_) = false;  // kDone came before the reactor was bound
  std::atomic<bool> cancelled_{false};
};

template <typename Request, typename Response, typename Stream>
void StreamMethod<Request, Response, Stream>::Ask(CallQueue& queue) {
  new Call(queue, *this);
}

}  // namespace call_queue_internal

template <typename Service, typename Base, typename Request, typename Response>
void CallQueue::AddUnary(Service* service, AskUnary<Base, Request, Response> ask,
                         void (Service::*serve)(grpc::ServerContext*, const Request*, Response*,
                                                Answer),
                         Serving serving) {
  grpc::ServerCompletionQueue* cq = cq_.get();
  methods_.push_back(std::make_unique<call_queue_internal::UnaryMethod<Request, Response>>(
      [service, ask, cq](grpc::ServerContext* context, Request* request,
                         grpc::ServerAsyncResponseWriter<Response>* responder,
                         void* tag) { (service->*ask)(context, request, responder, cq, cq, tag); },
      [service, serve](grpc::ServerContext* context, const Request* request, Response* response,
                       Answer answer) {
        (service->*serve)(context, request, response, std::move(answer));
      },
      serving));
}

template <typename Service, typename Base, typename Request, typename Response>
void CallQueue::AddClientStream(
    Service* service, AskClientStream<Base, Request, Response> ask,
    StreamReactor<Request, Response>* (Service::*serve)(grpc::ServerContext*, Response*,
                                                        StreamOps<Request, Response>*)) {
  using Stream = grpc::ServerAsyncReader<Response, Request>;
  grpc::ServerCompletionQueue* cq = cq_.get();
  methods_.push_back(std::make_unique<call_queue_internal::StreamMethod<Request, Response, Stream>>(
      [service, ask, cq](grpc::ServerContext* context, Request*, Stream* stream, void* tag) {
        (service->*ask)(context, stream, cq, cq, tag);
      },
      [service, serve](grpc::ServerContext* context, Request*, Response* response,
                       StreamOps<Request, Response>* ops) {
        return (service->*serve)(context, response, ops);
      }));
}

template <typename Service, typename Base, typename Request, typename Response>
void CallQueue::AddServerStream(
    Service* service, AskServerStream<Base, Request, Response> ask,
    StreamReactor<Request, Response>* (Service::*serve)(grpc::ServerContext*, const Request*,
                                                        StreamOps<Request, Response>*)) {
  using Stream = grpc::ServerAsyncWriter<Response>;
  grpc::ServerCompletionQueue* cq = cq_.get();
  methods_.push_back(std::make_unique<call_queue_internal::StreamMethod<Request, Response, Stream>>(
      [service, ask, cq](grpc::ServerContext* context, Request* request, Stream* stream,
                         void* tag) { (service->*ask)(context, request, stream, cq, cq, tag); },
      [service, serve](grpc::ServerContext* context, Request* request, Response*,
                       StreamOps<Request, Response>* ops) {
        return (service->*serve)(context, request, ops);
      }));
}

template <typename Service, typename Base, typename Request, typename Response>
void CallQueue::AddBidiStream(Service* service, AskBidiStream<Base, Request, Response> ask,
                              StreamReactor<Request, Response>* (Service::*serve)(
                                  grpc::ServerContext*, StreamOps<Request, Response>*)) {
  using Stream = grpc::ServerAsyncReaderWriter<Response, Request>;
  grpc::ServerCompletionQueue* cq = cq_.get();
  methods_.push_back(std::make_unique<call_queue_internal::StreamMethod<Request, Response, Stream>>(
      [service, ask, cq](grpc::ServerContext* context, Request*, Stream* stream, void* tag) {
        (service->*ask)(context, stream, cq, cq, tag);
      },
      [service, serve](grpc::ServerContext* context, Request*, Response*,
                       StreamOps<Request, Response>* ops) {
        return (service->*serve)(context, ops);
      }));
}

}  // namespace komputed::server
