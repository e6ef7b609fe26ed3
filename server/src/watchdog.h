#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/core/cancel_check.h"

namespace komputed::server {

// The kernel watchdog (--max_kernel_time): it follows every submission on every device queue and
// stops one that runs longer than its limit by setting its session's cancel word, which ends the
// session's dispatches within a loop iteration (core/cancel_check.h); then it tells its owner, who
// closes the session.
//
// A queue runs its submissions in order, so a submission's running time starts when it reaches
// the head of its queue: when it was submitted, or when the one before it finished, whichever is
// later. Time spent queued behind another session's work does not count against it.
//
// The queues of one device share its compute units, and a dispatch that never ends holds them:
// work on the device's other queues may wait for it without running. So per device, one
// submission is stopped at a time, the one that ran past its limit first; until it has ended, no
// other submission on that device is judged, and when it has ended, the time of the submissions
// at the head of the device's other queues starts again. A runaway costs its neighbours the wait,
// never their sessions. Thread-safe; shared by its tickets, which may outlive its owner.
class Watchdog : public std::enable_shared_from_this<Watchdog> {
 public:
  // Called on the watchdog's thread, once per submission, for one that ran past `limit`.
  using Overrun = std::function<void(const std::string& session_id, absl::Duration limit)>;
  // Called on the watchdog's thread, once per submission, for a stopped one that has not left
  // its device `stop_grace` after the stop: the device (the QueueKey's first) no longer answers.
  using Unresponsive =
      std::function<void(const void* device, const std::string& session_id, absl::Duration waited)>;
  // Looks every `interval` (the stop comes at most that late).
  static std::shared_ptr<Watchdog> Create(absl::Duration interval, Overrun on_overrun,
                                          absl::Duration stop_grace = absl::InfiniteDuration(),
                                          Unresponsive on_unresponsive = nullptr);
  // Stops the thread (idempotent): on_overrun is not called after it returns.
  void Stop();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A device queue: the device opening (what its queues share) and the queue's index on it.
  using QueueKey = std::pair<const void*, uint32_t>;

  // Follows a submission until the ticket is destroyed (when the submission has completed).
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    friend class Watchdog;
    Ticket(std::shared_ptr<Watchdog> watchdog, QueueKey queue, uint64_t id)
        : watchdog_(std::move(watchdog)), queue_(queue), id_(id) {}
    const std::shared_ptr<Watchdog> watchdog_;
    const QueueKey queue_;
    const uint64_t id_;
  };
  // A submission was made to `queue` for `session_id`, whose dispatches read `word`, at the
  // queue's place `order` (core::Sequence::Completion::order). The queue runs its submissions in
  // that order, so they are followed in it whatever the order of the calls: one submission of a
  // batch told after another session's later one does not make that one look as if it ran.
  std::unique_ptr<Ticket> Started(QueueKey queue, std::string session_id,
                                  std::shared_ptr<core::CancelWord> word, absl::Duration limit,
                                  uint64_t order);

  // Submissions followed now.
  size_t size() const;

 private:
  struct Entry {
    uint64_t id;
    std::string session_id;
    std::shared_ptr<core::CancelWord> word;
    absl::Duration limit;
    absl::Time submitted;
    bool stopped = false;
    absl::Time stopped_at;
    bool reported_unresponsive = false;
    uint64_t order = 0;  // its place in the queue's order
  };
  struct Queue {
    std::deque<Entry> entries;  // in the queue's order
    absl::Time head_since;      // when the head reached the head
  };
  Watchdog(absl::Duration interval, Overrun on_overrun, absl::Duration stop_grace,
           Unresponsive on_unresponsive);
  void Finished(QueueKey queue, uint64_t id);
  void Run();

  const absl::Duration interval_;
  const Overrun on_overrun_;
  const absl::Duration stop_grace_;
  const Unresponsive on_unresponsive_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<QueueKey, Queue> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex thread_mu_;  // serialises Stop
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace komputed::server
