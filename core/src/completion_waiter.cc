#include "komputed/core/completion_waiter.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "komputed/core/spin.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"

namespace komputed::core {
namespace {

// Without timeline semaphores a new submission is noticed within this long.
constexpr absl::Duration kFencePollBound = absl::Milliseconds(1);
// On a device of one queue, the longest wait for the oldest submission alone before the others
// (and a stop) are looked at again.
constexpr absl::Duration kOneQueueSlice = absl::Milliseconds(5);
// The longest single block, so that deadlines and stops are seen.
constexpr absl::Duration kMaxBlock = absl::Seconds(1);
// The most submissions of a lane that one pass checks (without the lock) for completion.
constexpr size_t kCollectLook = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<CompletionWaiter>> CompletionWaiter::Create(
    std::shared_ptr<Device> device, absl::Duration spin, size_t test_lanes) {
  auto waiter = std::unique_ptr<CompletionWaiter>(new CompletionWaiter(device, test_lanes));
  waiter->spin_ = spin;
  if (device->timeline_supported()) {
    VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    si.pNext = &ti;
    VkSemaphore semaphore = VK_NULL_HANDLE;
    KD_RETURN_IF_ERROR(device->Check(vkCreateSemaphore(device->handle(), &si, nullptr, &semaphore),
                                     "vkCreateSemaphore"));
    waiter->wake_ = SemaphoreHandle(device->handle(), semaphore);
  }
  waiter->thread_ = std::thread([w = waiter.get()] {
    NameThisThread("kd-waiter");
    w->Run();
  });
  return waiter;
}

CompletionWaiter::CompletionWaiter(std::shared_ptr<Device> device, size_t test_lanes)
    : device_(std::move(device)), test_lanes_(test_lanes > 0) {
  absl::MutexLock lock(&mu_);
  lanes_.resize(test_lanes_ ? test_lanes : std::max<size_t>(device_->queue_count(), 1));
  blocked_on_.assign(lanes_.size(), false);
  one_lane_ = lanes_.size() == 1;
}

size_t CompletionWaiter::LaneOf(const Sequence& sequence) {
  if (test_lanes_) return next_test_lane_++ % lanes_.size();
  return std::min(sequence.queue(), lanes_.size() - 1);
}

CompletionWaiter::~CompletionWaiter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    Wake();
  }
  if (thread_.joinable()) thread_.join();
}

void CompletionWaiter::Wake() {
  if (!wake_) return;
  VkSemaphoreSignalInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO};
  si.semaphore = wake_.get();
  si.value = ++wake_value_;
  vkSignalSemaphore(device_->handle(), &si);
}

void CompletionWaiter::Watch(std::shared_ptr<Sequence> sequence, absl::Time deadline,
                             std::function<void(absl::Status)> done) {
  Sequence::Completion completion = sequence->InFlight();
  if (!completion.running) {
    done(absl::OkStatus());
    return;
  }
  absl::MutexLock lock(&mu_);
  Lane& lane = lanes_[LaneOf(*sequence)];
  // In the order of the submissions (which may be watched in another order): usually at the end.
  auto at = lane.end();
  while (at != lane.begin() && std::prev(at)->completion.order > completion.order) --at;
  const bool oldest = at == lane.begin();
  const bool waited_on = blocked_on_[&lane - lanes_.data()];
  lane.insert(at, {std::move(sequence), completion, deadline, std::move(done)});
  ++count_;
  earliest_deadline_ = std::min(earliest_deadline_, deadline);
  watched_.fetch_add(1, std::memory_order_release);
  // Where the thread waits on the lane's oldest submission, a later one needs no wake-up: it
  // completes after that one.
  if (blocked_ && (!waited_on || oldest || deadline < blocked_until_)) {
    Wake();
    blocked_ = false;  // one wake-up: the thread looks at every lane again
  }
}

size_t CompletionWaiter::pending() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

bool CompletionWaiter::Signalled(const Sequence::Completion& c) const {
  if (c.timeline != VK_NULL_HANDLE) {
    uint64_t value = 0;
    VkResult r = vkGetSemaphoreCounterValue(device_->handle(), c.timeline, &value);
    return r != VK_SUCCESS || value >= c.value;  // errors: let Wait report them
  }
  return vkGetFenceStatus(device_->handle(), c.fence) != VK_NOT_READY;
}

bool CompletionWaiter::Poll(const std::vector<Sequence::Completion>& completions,
                            absl::Duration spin) const {
  if (spin <= absl::ZeroDuration()) return false;
  const absl::Time until = absl::Now() + spin;
  const uint64_t watched = watched_.load(std::memory_order_acquire);
  do {
    for (const Sequence::Completion& c : completions) {
      if (Signalled(c)) return true;
    }
    if (watched_.load(std::memory_order_acquire) != watched) return true;
    CpuRelax();
  } while (absl::Now() < until);
  return false;
}

void CompletionWaiter::Block(const std::vector<Sequence::Completion>& oldest, absl::Time now,
                             absl::Time until, uint64_t wake_target) {
  const auto ns = [&](absl::Duration bound) {
    return static_cast<uint64_t>(
        std::max<int64_t>(0, absl::ToInt64Nanoseconds(std::min(until - now, bound))));
  };
  bool timeline = static_cast<bool>(wake_);
  for (const Sequence::Completion& c : oldest) timeline &= c.timeline != VK_NULL_HANDLE;
  if (one_lane_) {
    // One lane (a device of one queue). A wait for one semaphore or fence blocks where waiting for
    // any of several may poll without sleeping (Mesa's common code does so for drivers without a
    // native wait-any, lavapipe among them), taking the CPU that a CPU device runs its work on.
    // Watches of other deadlines are seen within a slice.
    const Sequence::Completion& c = oldest.front();
    if (c.timeline != VK_NULL_HANDLE) {
      VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
      wi.semaphoreCount = 1;
      wi.pSemaphores = &c.timeline;
      wi.pValues = &c.value;
      vkWaitSemaphores(device_->handle(), &wi, ns(kOneQueueSlice));
    } else {
      device_->calls().WaitForFences(device_->handle(), 1, &c.fence, VK_TRUE, ns(kOneQueueSlice));
    }
  } else if (timeline) {
    std::vector<VkSemaphore> semaphores;
    std::vector<uint64_t> values;
    for (const Sequence::Completion& c : oldest) {
      semaphores.push_back(c.timeline);
      values.push_back(c.value);
    }
    semaphores.push_back(wake_.get());
    values.push_back(wake_target);
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.flags = VK_SEMAPHORE_WAIT_ANY_BIT;
    wi.semaphoreCount = static_cast<uint32_t>(semaphores.size());
    wi.pSemaphores = semaphores.data();
    wi.pValues = values.data();
    vkWaitSemaphores(device_->handle(), &wi, ns(kMaxBlock));
  } else {
    std::vector<VkFence> fences;
    for (const Sequence::Completion& c : oldest) fences.push_back(c.fence);
    device_->calls().WaitForFences(device_->handle(), static_cast<uint32_t>(fences.size()),
                                   fences.data(), VK_FALSE, ns(kFencePollBound));
  }
}

std::vector<std::pair<CompletionWaiter::Entry, absl::Status>> CompletionWaiter::Collect() {
  // How far each lane has completed, from its oldest on up to the first still running, checked
  // without the lock. Watch may insert meanwhile (an entry submitted before those checked lands
  // before them): every entry of a lane up to the last one seen complete, in submission order,
  // has completed.
  // A lane's first kCollectLook at most: when all of them have completed, the next pass (which
  // then finds the lane's oldest complete at once) takes the next ones.
  std::vector<std::vector<Sequence::Completion>> look(lanes_.size());
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const size_t n = std::min(lanes_[i].size(), kCollectLook);
    for (size_t k = 0; k < n; ++k) look[i].push_back(lanes_[i][k].completion);
  }
  mu_.Unlock();
  std::vector<uint64_t> done_through(look.size(), 0);  // 0: none seen complete
  for (size_t i = 0; i < look.size(); ++i) {
    for (const Sequence::Completion& c : look[i]) {
      if (!Signalled(c)) break;
      done_through[i] = c.order;
    }
  }
  const absl::Time after = absl::Now();
  mu_.Lock();
  std::vector<std::pair<Entry, absl::Status>> finished;
  // Those past their deadline (rare: a deadline is a whole eval timeout) are looked for in every
  // lane once the earliest deadline has passed, and the earliest of those left is found again.
  const bool deadline_passed = after >= earliest_deadline_;
  if (deadline_passed) earliest_deadline_ = absl::InfiniteFuture();
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    while (!lane.empty() && done_through[i] != 0 &&
           lane.front().completion.order <= done_through[i]) {
      finished.emplace_back(std::move(lane.front()), absl::OkStatus());
      lane.pop_front();
    }
    if (!deadline_passed) continue;
    // One that completed meanwhile is completed, not refused.
    for (auto it = lane.begin(); it != lane.end();) {
      if (after < it->deadline) {
        earliest_deadline_ = std::min(earliest_deadline_, it->deadline);
        ++it;
      } else if (Signalled(it->completion)) {
        finished.emplace_back(std::move(*it), absl::OkStatus());
        it = lane.erase(it);
      } else {
        finished.emplace_back(
            std::move(*it), absl::DeadlineExceededError("the submission did not complete in time"));
        it = lane.erase(it);
      }
    }
  }
  count_ -= finished.size();
  if (count_ == 0) earliest_deadline_ = absl::InfiniteFuture();
  return finished;
}

void CompletionWaiter::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (count_ == 0) {
      if (stopping_) return;
      mu_.Await(absl::Condition(
          +[](CompletionWaiter* w)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->stopping_ || w->count_ != 0; },
          this));
      continue;
    }
    // Block until the oldest submission of a lane completes, a Watch that needs the thread, or
    // the nearest deadline.
    const absl::Time now = absl::Now();
    const absl::Time until = std::min(now + kMaxBlock, earliest_deadline_);
    std::vector<Sequence::Completion> oldest;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      blocked_on_[i] = !lanes_[i].empty();
      if (lanes_[i].empty()) continue;
      oldest.push_back(lanes_[i].front().completion);
    }
    const uint64_t wake_target = wake_value_ + 1;
    const uint64_t seen = watched_.load(std::memory_order_relaxed);  // Watch counts under mu_
    blocked_until_ = until;
    mu_.Unlock();
    if (!Poll(oldest, std::min(spin_, until - now))) {
      bool block = false;
      {
        absl::MutexLock blocking(&mu_);
        // From here on a Watch that needs the thread wakes it; one that came since the lanes
        // were looked at is looked at first.
        block = watched_.load(std::memory_order_relaxed) == seen;
        blocked_ = block;
      }
      if (block) Block(oldest, absl::Now(), until, wake_target);
    }
    mu_.Lock();
    blocked_ = false;
    std::vector<std::pair<Entry, absl::Status>> finished = Collect();
    mu_.Unlock();
    for (auto& [entry, status] : finished) {
      if (status.ok()) {
        // Collects the result: runs host steps and reads timestamps. The fence has signalled or is
        // about to (the timeline semaphore of the same submission may signal first): polled
        // first, since a blocking wait on a GPU wakes tens of microseconds late (on an H100 a
        // tiny submission's fence was seen after 23-51 us by a blocking wait, after 13-15 us by
        // polling).
        if (spin_ > absl::ZeroDuration()) entry.sequence->Poll(spin_);
        status = entry.sequence->Wait(absl::Seconds(10));
      }
      entry.done(status);
    }
    mu_.Lock();
  }
}

}  // namespace komputed::core
