#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device_pool.h"
#include "metrics.h"
#include "session.h"
#include "work_gate.h"

namespace komputed::server {

struct SessionManagerOptions {
  // A session with no call and no open Execute stream (or eval in flight) for this long is closed.
  absl::Duration idle_timeout = absl::Seconds(60);
  absl::Duration eval_timeout = absl::Seconds(600);
  absl::Duration inline_wait = absl::ZeroDuration();  // SessionConfig::inline_wait
  absl::Duration spin = absl::ZeroDuration();         // SessionConfig::spin
  uint64_t max_message_bytes = 64 << 20;
  Metrics* metrics = nullptr;  // required; outlives the manager
  WorkGate* gate = nullptr;    // admits new sessions and evaluations; null: always admitted
};

// The open sessions, by id, and the reaper thread that closes idle ones. Owns the sessions
// (calls in progress share them). The pool must outlive the manager. Thread-safe.
class SessionManager {
 public:
  SessionManager(DevicePool* pool, SessionManagerOptions options);
  // Stops the reaper and closes every session.
  ~SessionManager();
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  const SessionManagerOptions& options() const { return options_; }

  // INVALID_ARGUMENT for a device index or queue request the daemon cannot serve; UNAVAILABLE
  // while the daemon drains or stops.
  absl::StatusOr<std::shared_ptr<Session>> Open(const v1::OpenSessionRequest& request,
                                                std::string peer);
  // The session, in use (so not reaped) until the returned pointer and all its copies are gone;
  // then it is touched: the idle time counts from the end of the last call or stream. A call
  // holds it for its whole length. INVALID_ARGUMENT for an empty id, NOT_FOUND for an unknown one.
  absl::StatusOr<std::shared_ptr<Session>> Get(absl::string_view id);
  // Frees everything the session holds. NOT_FOUND for an unknown id.
  absl::Status Close(absl::string_view id);
  std::vector<std::shared_ptr<Session>> List() const;
  // Closes every session (counted as reaped for "drain") and stops the reaper (idempotent).
  void Shutdown();

 private:
  void Reap();
  // Closes the sessions idle past the timeout; returns when to look next.
  absl::Time ReapOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a session taken out of the table; `reason` is a reaped_total label, or null when its
  // client closed it.
  void Free(Session& session, const char* reason);

  DevicePool* const pool_;
  const SessionManagerOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace komputed::server
