#pragma once
// The unary calls whose latency a client feels on every step (Sequences.Eval, Sessions.Ping),
// served on gRPC's completion-queue API by threads of komputed's own.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services.h"

namespace komputed::server {

// The callback API hands each call from the thread that read it to another one (Debian's gRPC
// 1.51). On a queue of its own, a call reaches the thread that serves it without that hand-off.
// And a thread that has just served an Eval looks at the queue without sleeping for `poll` before
// it blocks (one thread at a time), so that a client's next eval finds it awake instead of waking
// it tens of microseconds late. Polling costs that thread's core for up to `poll` after each eval;
// zero turns it off. A Ping does not start the polling.
//
// Lifetime: made before the server is built (it adds its queue to the builder), Start after the
// server has started, Shutdown after the server's Shutdown has returned. A call whose answer is
// still to come then (an eval on the device or the build pool, cancelled by gRPC) is waited for:
// the queue is shut down only once every call that arrived has been answered and deleted, and no
// call is asked for after Shutdown has begun. The services outlive it.
class UnaryQueue {
 public:
  UnaryQueue(grpc::ServerBuilder& builder, SequencesService* sequences, SessionsService* sessions,
             int threads, absl::Duration poll);
  ~UnaryQueue();
  UnaryQueue(const UnaryQueue&) = delete;
  UnaryQueue& operator=(const UnaryQueue&) = delete;

  void Start();
  // Waits for the calls still being answered, shuts the queue down and joins the threads;
  // idempotent.
  void Shutdown();

 private:
  class Call;
  class EvalCall;
  class PingCall;
  void Serve();
  void Handle(Call* call, bool ok);

  SequencesService* const sequences_;
  SessionsService* const sessions_;
  const int thread_count_;
  const absl::Duration poll_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> threads_;
  std::atomic<bool> polling_{false};  // a thread is polling the queue
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown has begun: no call is asked for
  int answering_ ABSL_GUARDED_BY(mu_) = 0;      // calls arrived and not yet deleted
  bool shut_down_ = false;
};

}  // namespace komputed::server
