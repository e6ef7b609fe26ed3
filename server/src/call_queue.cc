#include "call_queue.h"

#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "komputed/core/thread_name.h"

namespace komputed::server {

CallQueue::CallQueue(grpc::ServerBuilder& builder, int threads, absl::Duration poll,
                     absl::Duration hold_off)
    : thread_count_(std::max(threads, 1)),
      poll_(std::max(poll, absl::ZeroDuration())),
      hold_off_(std::max(hold_off, absl::ZeroDuration())),
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

thread_local CallQueue::Holder* CallQueue::serving_ = nullptr;

namespace {
int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void CallQueue::WillWait() {
  if (serving_ != nullptr) serving_->queue->HandOn(*serving_);
}

bool CallQueue::MayHold() {
  if (serving_ == nullptr || !serving_->holds) return false;
  CallQueue& q = *serving_->queue;
  if (SteadyNowNs() < q.hold_off_until_ns_.load(std::memory_order_relaxed)) return false;
  serving_->held_wait = true;
  serving_->held_peer = serving_->call != nullptr ? serving_->call->peer() : std::string();
  return true;
}

void CallQueue::Take(Holder& self) {
  if (self.holds) return;
  absl::MutexLock lock(&hold_mu_);
  hold_mu_.Await(absl::Condition(
      +[](CallQueue* q)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->hold_mu_) { return !q->held_ || q->drained_; },
      this));
  if (drained_) return;
  held_ = true;
  self.holds = true;
}

void CallQueue::HandOn(Holder& self) {
  if (!self.holds) return;
  absl::MutexLock lock(&hold_mu_);
  held_ = false;  // a waiting thread takes it as the lock is released
  self.holds = false;
  self.held_wait = false;
}

void CallQueue::Serve() {
  komputed::core::NameThisThread("kd-grpc");
  const int64_t poll = absl::ToInt64Nanoseconds(poll_);
  Holder self{this};
  void* tag = nullptr;
  bool ok = false;
  // After a wait that kept the queue (MayHold): the events to look at, without sleeping, for
  // other calls' events that waited behind it. The first is usually the answer's own.
  int look_behind = 0;
  for (;;) {
    Take(self);
    if (!self.holds) return;  // drained
    grpc::CompletionQueue::NextStatus next = grpc::CompletionQueue::TIMEOUT;
    if (look_behind > 0) {
      --look_behind;
      next = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (next == grpc::CompletionQueue::TIMEOUT) {
        look_behind = 0;
      } else if (next == grpc::CompletionQueue::GOT_EVENT && ok &&
                 static_cast<Tag*>(tag)->op != Op::kFinish &&
                 static_cast<Tag*>(tag)->call->peer() != self.held_peer) {
        // Another connection's call waited: the same client's next call is no sign of others.
        look_behind = 0;
        hold_off_until_ns_.store(SteadyNowNs() + absl::ToInt64Nanoseconds(hold_off_),
                                 std::memory_order_relaxed);
      }
    }
    // Each AsyncNext with a deadline already past looks at the queue (and the connections) once,
    // without sleeping; the window is read on every turn, as an answer may extend it meanwhile.
    while (next == grpc::CompletionQueue::TIMEOUT && poll > 0 &&
           SteadyNowNs() < poll_until_ns_.load(std::memory_order_relaxed)) {
      next = cq_->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
      if (next != grpc::CompletionQueue::TIMEOUT) break;
    }
    if (next == grpc::CompletionQueue::TIMEOUT) {
      next =
          cq_->Next(&tag, &ok) ? grpc::CompletionQueue::GOT_EVENT : grpc::CompletionQueue::SHUTDOWN;
    }
    if (next == grpc::CompletionQueue::SHUTDOWN) {
      absl::MutexLock lock(&hold_mu_);
      drained_ = true;  // every other thread returns too
      held_ = false;
      return;
    }
    Tag* t = static_cast<Tag*>(tag);
    // Read before Proceed, which may delete the call.
    const bool polls = ok && t->op == Op::kArrived && t->call->polls();
    if (!t->call->keeps_queue(t->op, ok)) HandOn(self);
    serving_ = &self;
    self.call = t->call;
    t->call->Proceed(t->op, ok);
    self.call = nullptr;
    serving_ = nullptr;
    if (std::exchange(self.held_wait, false)) look_behind = 2;
    if (polls) {
      const int64_t until = SteadyNowNs() + poll;
      int64_t seen = poll_until_ns_.load(std::memory_order_relaxed);
      while (seen < until &&
             !poll_until_ns_.compare_exchange_weak(seen, until, std::memory_order_relaxed)) {
      }
    }
  }
}

}  // namespace komputed::server
