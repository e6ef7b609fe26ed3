#include "watchdog.h"

#include <algorithm>
#include <vector>

namespace komputed::server {

std::shared_ptr<Watchdog> Watchdog::Create(absl::Duration interval, Overrun on_overrun) {
  auto watchdog = std::shared_ptr<Watchdog>(new Watchdog(interval, std::move(on_overrun)));
  absl::MutexLock lock(&watchdog->thread_mu_);
  watchdog->thread_ = std::thread([w = watchdog.get()] { w->Run(); });
  return watchdog;
}

Watchdog::Watchdog(absl::Duration interval, Overrun on_overrun)
    : interval_(interval), on_overrun_(std::move(on_overrun)) {}

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
                                                    absl::Duration limit) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  Queue& q = queues_[queue];
  const absl::Time now = absl::Now();
  if (q.entries.empty()) q.head_since = now;
  q.entries.push_back({id, std::move(session_id), std::move(word), limit, now});
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
  q.entries.erase(entry);
  if (q.entries.empty()) {
    queues_.erase(it);
  } else if (head) {
    // The next submission starts running now (or started when it was made, if that is later).
    q.head_since = std::max(absl::Now(), q.entries.front().submitted);
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
    const absl::Time now = absl::Now();
    std::vector<std::pair<std::string, absl::Duration>> stopped;
    for (auto& [key, q] : queues_) {
      Entry& head = q.entries.front();
      const absl::Time since = std::max(q.head_since, head.submitted);
      if (head.stopped || now - since <= head.limit) continue;
      head.stopped = true;
      if (head.word != nullptr) head.word->Set();
      stopped.emplace_back(head.session_id, head.limit);
    }
    if (stopped.empty()) continue;
    mu_.Unlock();
    for (const auto& [session_id, limit] : stopped) on_overrun_(session_id, limit);
    mu_.Lock();
  }
}

}  // namespace komputed::server
