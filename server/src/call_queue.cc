#include "call_queue.h"

#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>

#include "komputed/core/thread_name.h"

namespace komputed::server {

CallQueue::CallQueue(grpc::ServerBuilder& builder, int threads, absl::Duration poll)
    : thread_count_(std::max(threads, 1)),
      poll_(std::max(poll, absl::ZeroDuration())),
      cq_(builder.AddCompletionQueue()) {}

CallQueue::~CallQueue() { Shutdown(); }

void CallQueue::Start() {
  // Calls of each method asked for, one per thread: while a thread serves one, the next has a
  // place to arrive.
  {
    absl::MutexLock lock(&mu_);
    calls_ += thread_count_ * static_cast<int>(methods_.size());
  }
  for (int i = 0; i < thread_count_; ++i) {
    for (const auto& method : methods_) method->Ask(*this);
  }
  threads_.reserve(static_cast<size_t>(thread_count_));
  for (int i = 0; i < thread_count_; ++i) threads_.emplace_back([this] { Serve(); });
}

void CallQueue::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    // The threads go on serving the queue meanwhile: each call is deleted once its last event is
    // in, and the calls asked for come back refused once the server has shut down (or, matched
    // just before, as arrivals whose operations fail).
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    mu_.Await(absl::Condition(
        +[](int* calls) { return *calls == 0; }, &calls_));
  }
  cq_->Shutdown();
  if (threads_.empty()) {  // never started: what the queue holds is drained here
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) {
      Tag* t = static_cast<Tag*>(tag);
      t->call->Proceed(t->op, ok);
    }
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

void CallQueue::Arrived(Method& method) {
  {
    absl::MutexLock lock(&mu_);
    // Once Shutdown has begun no call is asked for: the queue is shut down once the last one is
    // deleted.
    if (stopping_) return;
    ++calls_;
  }
  method.Ask(*this);
}

void CallQueue::Release(Call* call) {
  delete call;
  absl::MutexLock lock(&mu_);
  --calls_;
}

void CallQueue::Serve() {
  komputed::core::NameThisThread("kd-grpc");
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
    Tag* t = static_cast<Tag*>(tag);
    // Whether this event is an arriving call that starts a polling window (read before Proceed,
    // which may delete the call).
    const bool polls = ok && t->op == Op::kArrived && t->call->polls();
    t->call->Proceed(t->op, ok);
    if (polls) poll_until = Clock::now() + poll;
  }
}

}  // namespace komputed::server
