#pragma once
// Waiting in tests for something that another thread or process brings about.

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace komputed::test_support {

// Polls `done` every `every` until it holds or `timeout` has passed; whether it held.
inline bool PollUntil(absl::Duration timeout, const std::function<bool()>& done,
                      absl::Duration every = absl::Milliseconds(20)) {
  const absl::Time until = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(every);
  }
  return true;
}

}  // namespace komputed::test_support
