#include "watchdog.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "komputed/core/thread_name.h"

namespace komputed::server {
namespace {

// A monotonic clock: steps of the wall clock (NTP, a VM resumed) neither stop a submission early
// nor give one extra time. Only differences between its values mean anything.
absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace

std::shared_ptr<Watchdog> Watchdog::Create(absl::Duration interval, Overrun on_overrun,
                                           absl::Duration stop_grace,
                                           Unresponsive on_unresponsive) {
  auto watchdog = std::shared_ptr<Watchdog>(
      new Watchdog(interval, std::move(on_overrun), stop_grace, std::move(on_unresponsive)));
  absl::MutexLock lock(&watchdog->thread_mu_);
  watchdog->thread_ = std::thread([w = watchdog.get()] {
    core::NameThisThread("kd-watchdog");
    w->Run();
  });
  return watchdog;
}

Watchdog::Watchdog(absl::Duration interval, Overrun on_overrun, absl::Duration stop_grace,
                   Unresponsive on_unresponsive)
    : interval_(interval),
      on_overrun_(std::move(on_overrun)),
      stop_grace_(stop_grace),
      on_unresponsive_(std::move(on_unresponsive)) {}

void Watchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&thread_mu_);
  if (thread_.joinable()) thread_.join();
}

Watchdog::~Watchdog() { Stop(); }

Watchdog::Ticket::~Ticket() { watchdog_->Finished(queue_, id_); }

std::unique_ptr<Watchdog::Ticket> Watchdog::Started(QueueKey queue, std::string session_id,
                                                    std::shared_ptr<core::CancelWord> word,
                                                    absl::Duration limit, uint64_t order) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  Queue& q = queues_[queue];
  const absl::Time now = MonotonicNow();
  Entry entry{id, std::move(session_id), std::move(word), limit, now};
  entry.order = order;
  // Usually last; before the later submissions already told.
  auto at = q.entries.end();
  while (at != q.entries.begin() && std::prev(at)->order > order) --at;
  // A new head: the queue runs it (it ran before the one taken for the head until now, whose
  // time starts again when it is the head once more).
  if (at == q.entries.begin()) q.head_since = now;
  q.entries.insert(at, std::move(entry));
  return std::unique_ptr<Ticket>(new Ticket(shared_from_this(), queue, id));
}

void Watchdog::Finished(QueueKey queue, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(queue);
  if (it == queues_.end()) return;
  Queue& q = it->second;
  auto entry =
      std::find_if(q.entries.begin(), q.entries.end(), [id](const Entry& e) { return e.id == id; });
  if (entry == q.entries.end()) return;
  const bool head = entry == q.entries.begin();
  const bool was_stopped = entry->stopped;
  q.entries.erase(entry);
  const absl::Time now = MonotonicNow();
  if (q.entries.empty()) {
    queues_.erase(it);
  } else if (head) {
    // The next submission starts running now (or started when it was made, if that is later).
    q.head_since = std::max(now, q.entries.front().submitted);
  }
  if (was_stopped) {
    // A stopped submission has left the device: what ran beside it on the device's other queues
    // may have waited for its compute units all along (a dispatch that never ends holds them),
    // so their time starts again.
    for (auto& [key, other] : queues_) {
      if (key.first == queue.first) other.head_since = std::max(other.head_since, now);
    }
  }
}

size_t Watchdog::size() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, q] : queues_) n += q.entries.size();
  return n;
}

void Watchdog::Run() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) {
    const absl::Time now = MonotonicNow();
    // Per device, the submission that ran past its limit first, unless one stopped before is
    // still ending there.
    struct Culprit {
      Entry* entry;
      const Queue* queue;
      uint32_t queue_index;
      absl::Time deadline;
    };
    absl::flat_hash_map<const void*, Culprit> culprits;
    absl::flat_hash_set<const void*> ending;
    struct Stuck {
      const void* device;
      std::string session_id;
      absl::Duration waited;
    };
    std::vector<Stuck> stuck;
    for (auto& [key, q] : queues_) {
      Entry& head = q.entries.front();
      if (head.stopped) {
        ending.insert(key.first);
        if (!head.reported_unresponsive && now - head.stopped_at > stop_grace_) {
          head.reported_unresponsive = true;
          stuck.push_back({key.first, head.session_id, now - head.stopped_at});
        }
        continue;
      }
      const absl::Time deadline = std::max(q.head_since, head.submitted) + head.limit;
      if (now <= deadline) continue;
      auto [it, first] = culprits.try_emplace(key.first, Culprit{&head, &q, key.second, deadline});
      if (!first && deadline < it->second.deadline) {
        it->second = Culprit{&head, &q, key.second, deadline};
      }
    }
    std::vector<std::pair<std::string, absl::Duration>> stopped;
    for (auto& [device, culprit] : culprits) {
      if (ending.contains(device)) continue;
      Entry* head = culprit.entry;
      const absl::Time since = culprit.deadline - head->limit;
      spdlog::warn(
          "watchdog: stopping a submission of session {} on queue {}: at the head of its queue "
          "for {} (limit {}; submitted {} ago; {} more queued behind it)",
          head->session_id, culprit.queue_index, absl::FormatDuration(now - since),
          absl::FormatDuration(head->limit), absl::FormatDuration(now - head->submitted),
          culprit.queue->entries.size() - 1);
      head->stopped = true;
      head->stopped_at = now;
      if (head->word != nullptr) head->word->Set();
      stopped.emplace_back(head->session_id, head->limit);
    }
    if (stopped.empty() && (stuck.empty() || on_unresponsive_ == nullptr)) continue;
    mu_.Unlock();
    for (const auto& [session_id, limit] : stopped) on_overrun_(session_id, limit);
    for (const Stuck& s : stuck) {
      spdlog::error(
          "watchdog: a submission of session {} was stopped {} ago and has not left its device: "
          "the device no longer answers",
          s.session_id, absl::FormatDuration(s.waited));
      if (on_unresponsive_) on_unresponsive_(s.device, s.session_id, s.waited);
    }
    mu_.Lock();
  }
}

}  // namespace komputed::server
