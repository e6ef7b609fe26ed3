#pragma once

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
  static absl::StatusOr<std::unique_ptr<CompletionWaiter>> Create(std::shared_ptr<Device> device);
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
  bool Signalled(const Entry& e) const;

  std::shared_ptr<Device> device_;
  SemaphoreHandle wake_;  // timeline, signalled by Watch and the destructor
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t wake_value_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace komputed::core
