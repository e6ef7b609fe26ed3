#pragma once
// An eval in komputed's own terms: what Session::Eval runs (EvalPlan) and what it gives back
// (EvalResult). session_wire.h converts them from and to the wire.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "session_requests.h"

namespace komputed::server {

// The host's monotonic clock (CLOCK_MONOTONIC) in nanoseconds: the clock of EvalStages, which
// every process on the host shares.
inline uint64_t MonotonicNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// One eval: its commands, run in order (stopping at the first failure; the ones before it stay
// applied), then its uploads into host data, then the submission of `sequence` (0: none) and,
// once that has completed, the downloads. Views refer to the request it came from and are read
// only while Session::Eval prepares the eval (before it returns or hands the wait off).
struct EvalPlan {
  struct Command {
    std::string name;  // for errors, e.g. "create_tensor 7"
    // The command, or why it could not be read (reported when its turn comes).
    absl::StatusOr<SessionCommand> command;
  };
  struct Upload {
    uint64_t tensor = 0;
    uint64_t offset = 0;  // in bytes
    absl::string_view data;
  };
  std::vector<Command> commands;
  std::vector<Upload> uploads;
  std::vector<uint64_t> downloads;  // tensors whose whole host data comes back
  uint64_t sequence = 0;
  // Bound on the wait for the submission; zero: the daemon's eval_timeout.
  absl::Duration timeout = absl::ZeroDuration();
  // Answer with the stages' moments; `received_ns` is when the call reached its handler.
  bool stage_times = false;
  uint64_t received_ns = 0;
};

// What a successful eval gives back.
struct EvalResult {
  struct Download {
    uint64_t tensor = 0;
    std::string data;  // the tensor's whole host data
  };
  std::vector<Download> downloads;  // in the plan's order
  std::vector<uint64_t> timestamps_ns;
  uint64_t device_time_ns = 0;  // last timestamp - first; 0 with fewer than two
  // Where the eval's time went (MonotonicNs), when the plan asked; the moment it is answered is
  // taken where the answer is written (wire::ToWire).
  struct Stages {
    uint64_t received_ns = 0;
    uint64_t started_ns = 0;     // Session::Eval began
    uint64_t submitting_ns = 0;  // commands and uploads applied, the submission about to start
    uint64_t submitted_ns = 0;
    uint64_t completed_ns = 0;
    bool waited_inline = false;
  };
  std::optional<Stages> stages;
};

}  // namespace komputed::server
