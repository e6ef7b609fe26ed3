#pragma once
// Polling without sleeping: the pause between two looks at what a polling loop waits for, and
// how long a wait for one submission polls before it sleeps.

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace komputed::core {

// Tells the CPU that this thread spins (x86 PAUSE, Arm YIELD): the core's other hardware thread
// runs at full speed meanwhile, and the loop checks less often, with less traffic on the memory
// or the driver it looks at. Every polling loop calls it between two checks.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

// How long a wait for one submission (a fence, an answer) polls before it sleeps, learned from
// what the submissions before it took. A sleeping wait wakes tens to hundreds of microseconds
// after the device is done (more on a virtual machine), which is more than a short submission
// runs; a submission of milliseconds is not worth a CPU's polling. So the wait polls for at least
// `base`, and, while the submissions of the one thing waited for (a sequence, a channel) take at
// most `limit`, until 1.5 times what the last one took has passed since the submission (at most
// `limit` after it): the next one is then caught by the polling where the last one was.
//
// What a wait saw feeds the next: a completion seen by the polling or by the sleep counts as
// what that submission took (a sleep's is longer than the device's time by the wake-up, so one
// caught by a sleep widens the window and the next is caught polling); one already complete at
// the first look only says it took at most that long. Thread-safe.
class SpinWindow {
 public:
  // base 0: never polls. limit: at least base.
  SpinWindow(absl::Duration base, absl::Duration limit)
      : base_(std::max(base, absl::ZeroDuration())), limit_(std::max(limit, base_)) {}

  absl::Duration base() const { return base_; }
  absl::Duration limit() const { return limit_; }

  // How long a wait that starts at `now` for a submission made at `submitted` polls.
  absl::Duration Window(absl::Time submitted, absl::Time now) const {
    if (base_ <= absl::ZeroDuration()) return absl::ZeroDuration();
    absl::Duration last;
    {
      absl::MutexLock lock(&mu_);
      last = last_;
    }
    if (last > limit_) return base_;  // none seen yet, or too long to poll for
    const absl::Duration until = std::min(limit_, std::max(base_, last * 3 / 2));
    return std::max(base_, submitted + until - now);
  }

  // What a wait saw: the submission completed `took` after it was made; `seen_running` whether
  // it was still running at the wait's first look (else `took` only bounds it from above).
  void Observe(absl::Duration took, bool seen_running) {
    absl::MutexLock lock(&mu_);
    if (seen_running || took < last_) last_ = took;
  }

 private:
  const absl::Duration base_;
  const absl::Duration limit_;
  mutable absl::Mutex mu_;
  absl::Duration last_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();  // the last one's time
};

}  // namespace komputed::core
