#include "work_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace komputed::server {

bool WorkGate::Enter() {
  absl::MutexLock lock(&mu_);
  if (closed_) return false;
  ++in_flight_;
  return true;
}

void WorkGate::Exit() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void WorkGate::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

bool WorkGate::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

int64_t WorkGate::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

bool WorkGate::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void WorkGate::NoteCall() {
  last_call_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
}

bool WorkGate::WaitQuiet(absl::Duration quiet, absl::Time deadline) {
  const absl::Time start = absl::Now();
  while (true) {
    const absl::Time quiet_at =
        std::max(start, absl::FromUnixNanos(last_call_ns_.load(std::memory_order_relaxed))) + quiet;
    const absl::Time now = absl::Now();
    if (now >= quiet_at) return true;
    if (now >= deadline) return false;
    absl::SleepFor(std::min(quiet_at, deadline) - now);
  }
}

absl::Status WorkGate::Refusal(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("komputed is draining: it takes no new ", what,
                   " (it is shutting down; use another daemon, or retry after it restarts)"));
}

}  // namespace komputed::server
