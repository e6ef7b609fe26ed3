#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"
#include "komputed/core/sequence.h"

namespace komputed::core {

// One thread per device that waits for many submissions at once and calls back as each
// completes: no thread per submission. The submissions of one queue complete in the order they
// were made, so the thread waits only for the first made of the watched submissions of each queue
// that has any, and then collects that queue's completed ones from the oldest on: its work per
// wake-up and the objects it waits on grow with the queues in use, not with the submissions in
// flight. Where the device has timeline semaphores and several queues it blocks in one
// vkWaitSemaphores over those oldest submissions plus a wake-up semaphore, which Watch() signals
// from the host only when the thread is blocked without the new submission's queue (or past its
// deadline); with one queue it blocks on the oldest submission alone; without timeline semaphores
// it waits on fences with a short bound. Thread-safe. Callbacks run on the waiter's thread, one at
// a time: keep them short.
class CompletionWaiter {
 public:
  // Before each block the thread polls the watched submissions (and for new ones) for up to
  // `spin`: under a steady stream of short submissions it then never sleeps, where a blocked
  // thread would wake tens of microseconds late for each. Zero: no polling (CPU devices, whose
  // work needs the cores).
  // `test_lanes` (tests only; 0: off) spreads the submissions of a device of one queue over that
  // many lanes in turn, waited on together as the lanes of several queues are.
  static absl::StatusOr<std::unique_ptr<CompletionWaiter>> Create(
      std::shared_ptr<Device> device, absl::Duration spin = absl::ZeroDuration(),
      size_t test_lanes = 0);
  // Completes every watched submission first (waiting for each up to its deadline).
  ~CompletionWaiter();

  // Calls done(status) once `sequence`'s submission in flight has completed and its host steps
  // have run (status OK), failed (device loss: UNAVAILABLE), or is still running at `deadline`
  // (DEADLINE_EXCEEDED; the submission stays in flight). A sequence with nothing in flight is
  // done at once (OK). The waiter holds `sequence` until then.
  void Watch(std::shared_ptr<Sequence> sequence, absl::Time deadline,
             std::function<void(absl::Status)> done);

  // Submissions being watched now.
  size_t pending() const;

 private:
  struct Entry {
    std::shared_ptr<Sequence> sequence;
    Sequence::Completion completion;
    absl::Time deadline;
    std::function<void(absl::Status)> done;
  };
  // The submissions watched on one queue, in the order they were made (Completion::order).
  using Lane = std::deque<Entry>;
  CompletionWaiter(std::shared_ptr<Device> device, size_t test_lanes);
  size_t LaneOf(const Sequence& sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Signalled(const Sequence::Completion& c) const;
  // Polls `completions` for up to `spin`: whether one completed or a new entry came.
  bool Poll(const std::vector<Sequence::Completion>& completions, absl::Duration spin) const;
  // Blocks until one of `oldest` (one per lane with entries) completes, `until`, a slice, or (where
  // the thread waits on the wake-up semaphore) a Watch that needs the thread.
  void Block(const std::vector<Sequence::Completion>& oldest, absl::Time now, absl::Time until,
             uint64_t wake_target);
  // Takes out of the lanes, in each lane's order, the entries that have completed (checked
  // without the lock: only this thread removes entries; at most kCollectLook of a lane per call)
  // or whose deadline has passed (looked for only once earliest_deadline_ has passed).
  std::vector<std::pair<Entry, absl::Status>> Collect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<Device> device_;
  SemaphoreHandle wake_;  // timeline, signalled by Watch (when needed) and the destructor
  mutable absl::Mutex mu_;
  std::vector<Lane> lanes_ ABSL_GUARDED_BY(mu_);  // by the sequences' queue index
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;         // entries in all lanes
  // No entry's deadline is earlier (the earliest one's, or earlier once that entry has gone): a
  // pass looks at every entry's deadline only once it has passed, not at each completion.
  absl::Time earliest_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  size_t next_test_lane_ ABSL_GUARDED_BY(mu_) = 0;  // test_lanes: round robin
  // While the thread blocks on the wake-up semaphore: until when, and on which lanes' oldest
  // submissions. A Watch wakes it only for a lane not among them or for an earlier deadline.
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time blocked_until_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> blocked_on_ ABSL_GUARDED_BY(mu_);
  uint64_t wake_value_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration spin_ = absl::ZeroDuration();
  bool test_lanes_ = false;
  bool one_lane_ = true;              // set once, before the thread starts
  std::atomic<uint64_t> watched_{0};  // Watch calls so far (read without the lock while polling)
  std::thread thread_;
};

}  // namespace komputed::core
