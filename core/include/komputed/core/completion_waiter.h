#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
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
// completes: no thread per submission and no polling. Where the device has timeline semaphores
// it blocks in one vkWaitSemaphores over every watched submission plus a wake-up semaphore that
// Watch() signals from the host; otherwise it waits on the fences with a short bound.
// Thread-safe. Callbacks run on the waiter's thread, one at a time: keep them short.
class CompletionWaiter {
 public:
  // Before each block the thread polls the watched submissions (and for new ones) for up to
  // `spin`: under a steady stream of short submissions it then never sleeps, where a blocked
  // thread would wake tens of microseconds late for each. Zero: no polling (CPU devices, whose
  // work needs the cores).
  static absl::StatusOr<std::unique_ptr<CompletionWaiter>> Create(
      std::shared_ptr<Device> device, absl::Duration spin = absl::ZeroDuration());
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
  explicit CompletionWaiter(std::shared_ptr<Device> device);
  void Run();
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Signalled(const Sequence::Completion& c) const;
  // Polls `completions` for up to `spin`: whether one completed or a new entry came.
  bool Poll(const std::vector<Sequence::Completion>& completions, absl::Duration spin) const;

  std::shared_ptr<Device> device_;
  SemaphoreHandle wake_;  // timeline, signalled by Watch and the destructor
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t wake_value_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration spin_ = absl::ZeroDuration();
  std::atomic<uint64_t> watched_{0};  // Watch calls so far (read without the lock while polling)
  std::thread thread_;
};

}  // namespace komputed::core
