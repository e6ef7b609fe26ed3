#pragma once
// The daemon's end of the same-host side channel (komputed/v1/shared_memory_wire.h): an abstract
// Unix socket, one thread that accepts its connections and reads their first record, a worker that
// takes passed regions (importing them into the device), and a few reactor threads that serve the
// bound channels. A connection either passes one shared-memory region and is closed, or binds
// itself to a session and carries that session's evals on the reactor that it is given: one at a
// time (kEval), or up to v1::wire::kMaxChannelSubmits submitted at once (kSubmit). A connection
// that binds nothing within a short time is closed; so are connections beyond a fixed number at
// once. A reactor runs an eval on its own thread: it may wait for a short submission there
// (bounded, as the gRPC serving threads do: Session::Eval's inline wait), so that the answer needs
// no hand-off; longer ones are answered from the completion waiter. A bound channel may pass a ring
// of shared memory (kRing): its evals then come and go through the ring, which its reactor looks at
// on every turn (and, where it polls, between two polls), and the socket carries only doorbells.

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/v1/shared_memory_wire.h"

namespace komputed::server {

class SharedMemoryListener {
 public:
  // How the daemon woke a same-host client asleep for a ring's answer: on the ring's answer
  // number (a futex wake), or with a doorbell record on the channel's socket.
  enum class RingWake { kAnswerWord, kSocket };
  struct Handlers {
    // Takes a request's region (its descriptor is the callee's, open or closed, once called) and
    // says how it went; the client receives the status.
    std::function<absl::Status(v1::wire::SharedMemoryAttach request)> take;
    // Whether `ticket` is an open session's: a channel binds to it.
    std::function<absl::Status(absl::string_view ticket)> bind;
    // Runs the serialized EvalRequest `request` in the session of `ticket`, and calls `done`
    // once, from any thread, with the serialized EvalResponse or the error. Called on a reactor
    // thread, which may wait for the device a bounded time where `may_wait_inline` (kEval; a
    // kSubmit's answer comes from the completion waiter, so that the next record is read at once).
    std::function<void(const std::string& ticket, std::string request, bool may_wait_inline,
                       std::function<void(absl::StatusOr<std::string> response)> done)>
        eval;
    // Called when a channel takes a ring (v1::wire::ChannelRing), and for each eval that comes
    // through one; either may be empty.
    std::function<void()> ring_taken;
    std::function<void()> ring_eval;
    // Called after a ring's answer that woke its client, with how (may be empty; from any thread).
    std::function<void(RingWake way)> ring_wake;
    // Whether a reactor may poll now (empty: always). Asked while a reactor polls, so that it
    // stops where the cores are wanted elsewhere (a CPU device's work in flight).
    std::function<bool()> may_poll;
  };
  // Listens on a new abstract name (komputed-<pid>-<random>), with `reactors` threads (at least
  // 1) that serve the bound channels. After serving a record, a reactor polls its channels
  // without sleeping for up to `spin` before it blocks (a client's next eval often follows its
  // answer closely; a blocked thread wakes tens of microseconds late), while `may_poll` lets it.
  static absl::StatusOr<std::unique_ptr<SharedMemoryListener>> Start(
      Handlers handlers, size_t reactors, absl::Duration spin = absl::ZeroDuration());
  // Stops the thread and closes every connection (answers still to come are dropped).
  ~SharedMemoryListener();
  SharedMemoryListener(const SharedMemoryListener&) = delete;
  SharedMemoryListener& operator=(const SharedMemoryListener&) = delete;

  // The abstract name, without its leading NUL (OpenSessionResponse.shared_memory_socket).
  const std::string& name() const { return name_; }

 private:
  struct Connection;
  struct Reactor;
  SharedMemoryListener() = default;
  void Run();
  void React(Reactor& reactor);
  // What becomes of a connection after one of its records.
  enum class Next { kKeep, kClose, kBound };
  // Handles one record of `c` (on the listener's thread for unbound connections, on its
  // reactor's for bound ones).
  Next Handle(const std::shared_ptr<Connection>& c, v1::wire::ReceivedRecord received);
  // A kSubmit record's eval, answered with its id.
  Next Submit(const std::shared_ptr<Connection>& c, absl::string_view payload);
  // Reads the record waiting on `c` and handles it (kKeep when none had come after all).
  Next Serve(const std::shared_ptr<Connection>& c);
  // A kRing record's descriptor (taken: closed whatever happens, once mapped).
  Next AttachRing(const std::shared_ptr<Connection>& c, v1::wire::PassedFd fd);
  // Runs the request waiting in the ring of `c`, if one is (`*served` then true).
  Next ServeRing(const std::shared_ptr<Connection>& c, bool* served);

  std::string name_;
  Handlers handlers_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that the destructor signals
  std::thread thread_;
  // The worker that takes regions, and its queue (at most one job per unbound connection).
  void Work();
  absl::Mutex jobs_mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool stopping_ ABSL_GUARDED_BY(jobs_mu_) = false;
  std::thread worker_;
  std::vector<std::unique_ptr<Reactor>> reactors_;
  // Whether records of user `user` are read with their descriptors: not while too many that the
  // user passed, or that all users passed, wait for their close. Logged as it changes.
  bool TakesDescriptors(uid_t user) ABSL_LOCKS_EXCLUDED(refusing_mu_);
  absl::Mutex refusing_mu_;
  bool refusing_all_ ABSL_GUARDED_BY(refusing_mu_) = false;
  absl::flat_hash_set<uid_t> refusing_users_ ABSL_GUARDED_BY(refusing_mu_);
  absl::Duration spin_ = absl::ZeroDuration();
  size_t next_reactor_ = 0;  // the listener's thread only
};

// `bytes` random bytes from the kernel's random source (a seeded generator where it has none), as
// 2 * `bytes` hex digits: session ids, tickets, socket names.
std::string RandomHex(size_t bytes);
// A new random ticket (v1::wire::kSharedMemoryTicketSize hex characters).
std::string NewSharedMemoryTicket();

}  // namespace komputed::server
