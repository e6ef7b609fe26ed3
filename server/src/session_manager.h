#pragma once

#include <cstdint>
#include <deque>
#include <functional>
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
#include "auth.h"
#include "device_pool.h"
#include "metrics.h"
#include "server_options.h"
#include "session.h"
#include "shared_memory_listener.h"
#include "watchdog.h"
#include "work_gate.h"

namespace komputed::server {

// What OpenSession asks for.
struct OpenRequest {
  uint32_t device_index = 0;
  // One entry per queue: the queue family it comes from (PooledDevice::AcquireQueues).
  std::vector<uint32_t> queue_families;
  std::string client_name;
  std::string peer;  // where the call came from, for logs and ListSessions
  Caller caller;     // the tenant that opens it, and owns it from then on
};

// The open sessions, by id, and the reaper thread that closes idle ones (after the options'
// session_idle_timeout). Owns the sessions (calls in progress share them). The pool, the options,
// the metrics and the gate (null: always admitted; it admits new sessions and evaluations) must
// outlive the manager and its sessions. Thread-safe.
class SessionManager {
 public:
  SessionManager(DevicePool* pool, const ServerOptions& options, Metrics* metrics, WorkGate* gate);
  // Stops the reaper and closes every session.
  ~SessionManager();
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  // INVALID_ARGUMENT for a device index or queue request the daemon cannot serve; UNAVAILABLE
  // while the daemon drains or stops; RESOURCE_EXHAUSTED past the tenant's sessions or
  // client_name_bytes quota.
  absl::StatusOr<std::shared_ptr<Session>> Open(OpenRequest request);
  // The caller's session, in use (so not reaped) until the returned pointer and all its copies
  // are gone; then it is touched: the idle time counts from the end of the last call or stream.
  // A call holds it for its whole length. INVALID_ARGUMENT for an empty id; NOT_FOUND for an
  // unknown id and, with the same message, for another tenant's session.
  absl::StatusOr<std::shared_ptr<Session>> Get(absl::string_view id, const Caller& caller);
  // Frees everything the session holds. NOT_FOUND for an unknown id, or for another tenant's
  // session unless the caller is an admin.
  absl::Status Close(absl::string_view id, const Caller& caller);
  // The caller's sessions, or every session for an admin, oldest first.
  std::vector<std::shared_ptr<Session>> List(const Caller& caller) const;
  // Closes every session (counted as reaped for "drain") and stops the reaper (idempotent).
  void Shutdown();
  // The abstract socket where same-host clients pass shared memory (empty: none, as with
  // options.shared_memory off or where it could not listen).
  std::string shared_memory_socket() const {
    return shared_memory_ != nullptr ? shared_memory_->name() : std::string();
  }

 private:
  void Reap();
  // The session of a shared-memory ticket, in use as Get's.
  absl::StatusOr<std::shared_ptr<Session>> UseByTicket(absl::string_view ticket)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An eval on the same-host channel (SharedMemoryListener::Handlers::eval).
  void SameHostEval(const std::string& ticket, std::string request, bool may_wait_inline,
                    std::function<void(absl::StatusOr<std::string>)> done);
  // A region passed on the shared-memory socket: mapped and handed to the session of its ticket.
  absl::Status TakeSharedMemory(v1::wire::SharedMemoryAttach request) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the sessions idle past the timeout; returns when to look next.
  absl::Time ReapOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a session taken out of the table; `reason` is a reaped_total label, or null when its
  // client closed it.
  void Free(Session& session, const char* reason);
  // The watchdog stopped a submission of the session: closes it, and remembers why for its
  // client's next call.
  void Overrun(const std::string& id, absl::Duration limit);
  // The watchdog's word for a device instance that no longer answers: it is declared lost.
  void Unresponsive(const void* instance, const std::string& id, absl::Duration waited);
  // For an id not in the table: why the daemon closed it (FAILED_PRECONDITION, for its own
  // tenant), or the NOT_FOUND of an unknown id.
  absl::Status Missing(absl::string_view id, const Caller& caller) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DevicePool* const pool_;
  const ServerOptions& options_;
  const std::string daemon_;  // this daemon, as errors name it: its host, and advertised address
  Metrics* const metrics_;
  WorkGate* const gate_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Sessions the daemon closed (the watchdog), with the tenant and the reason: the most recent
  // kMaxClosedKept, oldest first in closed_order_.
  struct Closed {
    std::string tenant;
    std::string reason;
  };
  absl::flat_hash_map<std::string, Closed> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(mu_);
  // Sessions offered shared memory, by ticket (an entry goes with its session, in Free).
  absl::flat_hash_map<std::string, std::weak_ptr<Session>> tickets_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
  // Declared after the tables that its thread's calls use: stopped before they go.
  std::unique_ptr<SharedMemoryListener> shared_memory_;
  // Null without --max_kernel_time. Stopped by Shutdown; its tickets may outlive the manager.
  std::shared_ptr<Watchdog> watchdog_;
};

}  // namespace komputed::server
