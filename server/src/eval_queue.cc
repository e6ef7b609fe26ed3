#include "eval_queue.h"

#include <grpc/support/time.h>

#include <utility>

#include "absl/time/clock.h"

namespace komputed::server {

// One Eval call: asked for (its request not yet arrived), then being answered.
struct EvalQueue::Call {
  Call() : responder(&context) {}
  grpc::ServerContext context;
  v1::EvalRequest request;
  v1::EvalResponse response;
  grpc::ServerAsyncResponseWriter<v1::EvalResponse> responder;
  bool answering = false;  // its request has arrived: its next event is the answer's
};

EvalQueue::EvalQueue(grpc::ServerBuilder& builder, SequencesService* service, int threads,
                     absl::Duration poll)
    : service_(service),
      thread_count_(std::max(threads, 1)),
      poll_(std::max(poll, absl::ZeroDuration())),
      cq_(builder.AddCompletionQueue()) {}

EvalQueue::~EvalQueue() { Shutdown(); }

void EvalQueue::Start() {
  // One call asked for per thread: while a thread serves one, the next has a place to arrive.
  for (int i = 0; i < thread_count_; ++i) Request();
  threads_.reserve(static_cast<size_t>(thread_count_));
  for (int i = 0; i < thread_count_; ++i) threads_.emplace_back([this] { Serve(); });
}

void EvalQueue::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  cq_->Shutdown();
  if (threads_.empty()) {  // never started: what the queue holds is drained here
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) delete static_cast<Call*>(tag);
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void EvalQueue::Request() {
  auto* call = new Call();
  service_->RequestEval(&call->context, &call->request, &call->responder, cq_.get(), cq_.get(),
                        call);
}

void EvalQueue::Handle(Call* call, bool ok) {
  // Answered (whether or not the answer reached the client), or a call asked for that will not
  // come: the server is shutting down.
  if (call->answering || !ok) {
    delete call;
    return;
  }
  Request();
  call->answering = true;
  // The call is deleted by the thread that sees its answer's event, after `finish` has run.
  service_->ServeEval(
      &call->context, &call->request, &call->response,
      [call](const grpc::Status& status) { call->responder.Finish(call->response, status, call); });
}

void EvalQueue::Serve() {
  absl::Time poll_until = absl::InfinitePast();
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    bool got = false;
    if (poll_ > absl::ZeroDuration() && absl::Now() < poll_until &&
        !polling_.exchange(true, std::memory_order_acquire)) {
      // Each AsyncNext with a deadline already past looks at the queue (and the connections)
      // once, without sleeping.
      grpc::CompletionQueue::NextStatus next = grpc::CompletionQueue::TIMEOUT;
      while (next == grpc::CompletionQueue::TIMEOUT && absl::Now() < poll_until) {
        next = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      }
      polling_.store(false, std::memory_order_release);
      if (next == grpc::CompletionQueue::SHUTDOWN) return;
      got = next == grpc::CompletionQueue::GOT_EVENT;
    }
    if (!got && !cq_->Next(&tag, &ok)) return;
    Handle(static_cast<Call*>(tag), ok);
    poll_until = absl::Now() + poll_;
  }
}

}  // namespace komputed::server
