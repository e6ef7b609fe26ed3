#include "unary_queue.h"

#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace komputed::server {

// One call of a method: asked for (its request not yet arrived), then being answered. Its tag on
// the queue is itself.
class UnaryQueue::Call {
 public:
  virtual ~Call() = default;
  // Asks gRPC for the next call of the same method.
  virtual void RequestAnother(UnaryQueue& queue) = 0;
  // Answers the call (now or later, from another thread); the call is deleted on its answer's
  // event.
  virtual void Answer(UnaryQueue& queue) = 0;
  // Whether serving it starts the thread's polling for the next call.
  virtual bool polls() const = 0;

  bool answering = false;  // its request has arrived: its next event is the answer's

 protected:
  grpc::ServerContext context_;
};

class UnaryQueue::EvalCall final : public Call {
 public:
  explicit EvalCall(UnaryQueue& queue) {
    queue.sequences_->RequestEval(&context_, &request_, &responder_, queue.cq_.get(),
                                  queue.cq_.get(), this);
  }
  void RequestAnother(UnaryQueue& queue) override { new EvalCall(queue); }
  void Answer(UnaryQueue& queue) override {
    queue.sequences_->ServeEval(
        &context_, &request_, &response_,
        [this](const grpc::Status& status) { responder_.Finish(response_, status, this); });
  }
  bool polls() const override { return true; }

 private:
  v1::EvalRequest request_;
  v1::EvalResponse response_;
  grpc::ServerAsyncResponseWriter<v1::EvalResponse> responder_{&context_};
};

class UnaryQueue::PingCall final : public Call {
 public:
  explicit PingCall(UnaryQueue& queue) {
    queue.sessions_->RequestPing(&context_, &request_, &responder_, queue.cq_.get(),
                                 queue.cq_.get(), this);
  }
  void RequestAnother(UnaryQueue& queue) override { new PingCall(queue); }
  void Answer(UnaryQueue& queue) override {
    const grpc::Status status = queue.sessions_->ServePing(&context_, &request_, &response_);
    responder_.Finish(response_, status, this);
  }
  bool polls() const override { return false; }

 private:
  v1::PingRequest request_;
  v1::PingResponse response_;
  grpc::ServerAsyncResponseWriter<v1::PingResponse> responder_{&context_};
};

UnaryQueue::UnaryQueue(grpc::ServerBuilder& builder, SequencesService* sequences,
                       SessionsService* sessions, int threads, absl::Duration poll)
    : sequences_(sequences),
      sessions_(sessions),
      thread_count_(std::max(threads, 1)),
      poll_(std::max(poll, absl::ZeroDuration())),
      cq_(builder.AddCompletionQueue()) {}

UnaryQueue::~UnaryQueue() { Shutdown(); }

void UnaryQueue::Start() {
  // Calls of each method asked for, one per thread: while a thread serves one, the next has a
  // place to arrive.
  for (int i = 0; i < thread_count_; ++i) {
    new EvalCall(*this);
    new PingCall(*this);
  }
  threads_.reserve(static_cast<size_t>(thread_count_));
  for (int i = 0; i < thread_count_; ++i) threads_.emplace_back([this] { Serve(); });
}

void UnaryQueue::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    // The threads go on serving the queue meanwhile: each answer's event deletes its call.
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    mu_.Await(absl::Condition(
        +[](int* answering) { return *answering == 0; }, &answering_));
  }
  cq_->Shutdown();
  if (threads_.empty()) {  // never started: what the queue holds is drained here
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) delete static_cast<Call*>(tag);
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void UnaryQueue::Handle(Call* call, bool ok) {
  if (call->answering) {  // answered, whether or not the answer reached the client
    delete call;
    absl::MutexLock lock(&mu_);
    --answering_;
    return;
  }
  if (!ok) {  // a call asked for that will not come: the server is shutting down
    delete call;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++answering_;
    // Once Shutdown has begun the queue may be shut down as soon as the last answer is in: no
    // call is asked for on it any more.
    if (!stopping_) call->RequestAnother(*this);
  }
  call->answering = true;
  call->Answer(*this);
}

void UnaryQueue::Serve() {
  using Clock = std::chrono::steady_clock;
  const auto poll = absl::ToChronoNanoseconds(poll_);
  Clock::time_point poll_until = Clock::time_point::min();
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    bool got = false;
    if (poll_ > absl::ZeroDuration() && Clock::now() < poll_until &&
        !polling_.exchange(true, std::memory_order_acquire)) {
      // Each AsyncNext with a deadline already past looks at the queue (and the connections)
      // once, without sleeping.
      grpc::CompletionQueue::NextStatus next = grpc::CompletionQueue::TIMEOUT;
      while (next == grpc::CompletionQueue::TIMEOUT && Clock::now() < poll_until) {
        next = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      }
      polling_.store(false, std::memory_order_release);
      if (next == grpc::CompletionQueue::SHUTDOWN) return;
      got = next == grpc::CompletionQueue::GOT_EVENT;
    }
    if (!got && !cq_->Next(&tag, &ok)) return;
    auto* call = static_cast<Call*>(tag);
    // Whether this event is an arriving call that starts a polling window (read before Handle,
    // which may delete the call).
    const bool polls = ok && !call->answering && call->polls();
    Handle(call, ok);
    if (polls) poll_until = Clock::now() + poll;
  }
}

}  // namespace komputed::server
