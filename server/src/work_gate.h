#pragma once

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace komputed::server {

// Admits new work (sessions, evaluations) while the daemon runs, and counts the evaluations in
// flight so that a drain can wait for them. Owned by the Server; outlives the services and the
// sessions. Thread-safe.
class WorkGate {
 public:
  // Starts an evaluation: true, and the caller must call Exit once it has completed; or false once
  // the gate is closed: the caller refuses the work with Refusal().
  bool Enter();
  void Exit();
  // From now on Enter returns false (idempotent).
  void Close();
  bool closed() const;
  // Evaluations entered and not exited.
  int64_t in_flight() const;
  // Waits until nothing is in flight, or `deadline`; true when nothing is in flight.
  bool WaitIdle(absl::Time deadline);

  // A call arrived (any RPC; cheap, called for each).
  void NoteCall();
  // Waits until no call has arrived for `quiet` (counted from now at the earliest), or
  // `deadline`; true when it was quiet. A drain
  // waits for this before it stops gRPC, so that clients still calling get their answer (a
  // refusal: UNAVAILABLE) rather than a call cut off by the shutdown (CANCELLED), which would
  // look to them like work lost.
  bool WaitQuiet(absl::Duration quiet, absl::Time deadline);

  // UNAVAILABLE: "komputed is draining ..." (the client should go to another daemon or retry).
  static absl::Status Refusal(absl::string_view what);

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> last_call_ns_{0};  // absl::GetCurrentTimeNanos() of the latest call
};

}  // namespace komputed::server
