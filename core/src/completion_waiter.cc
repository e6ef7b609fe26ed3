#include "komputed/core/completion_waiter.h"

#include <algorithm>

#include "komputed/core/status.h"

namespace komputed::core {
namespace {

// Without timeline semaphores a new submission is noticed within this long.
constexpr absl::Duration kFencePollBound = absl::Milliseconds(1);
// On a device of one queue, the longest wait for the oldest submission alone before the others
// (and a stop) are looked at again.
constexpr absl::Duration kOneQueueSlice = absl::Milliseconds(5);
// The longest single block, so that deadlines and stops are seen.
constexpr absl::Duration kMaxBlock = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<CompletionWaiter>> CompletionWaiter::Create(
    std::shared_ptr<Device> device, absl::Duration spin) {
  auto waiter = std::unique_ptr<CompletionWaiter>(new CompletionWaiter(device));
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
  waiter->thread_ = std::thread([w = waiter.get()] { w->Run(); });
  return waiter;
}

CompletionWaiter::CompletionWaiter(std::shared_ptr<Device> device) : device_(std::move(device)) {}

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
  if (completion.fence == VK_NULL_HANDLE) {
    done(absl::OkStatus());
    return;
  }
  absl::MutexLock lock(&mu_);
  entries_.push_back({std::move(sequence), completion, deadline, std::move(done)});
  watched_.fetch_add(1, std::memory_order_release);
  Wake();
}

size_t CompletionWaiter::pending() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
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
  } while (absl::Now() < until);
  return false;
}

void CompletionWaiter::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (entries_.empty()) {
      if (stopping_) return;
      mu_.Await(absl::Condition(
          +[](CompletionWaiter* w)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->stopping_ || !w->entries_.empty(); },
          this));
      continue;
    }
    // Block until a watched submission completes, a new one arrives, or the nearest deadline.
    const absl::Time now = absl::Now();
    absl::Time until = now + kMaxBlock;
    for (const Entry& e : entries_) until = std::min(until, e.deadline);
    std::vector<VkSemaphore> semaphores;
    std::vector<uint64_t> values;
    std::vector<VkFence> fences;
    bool timeline = static_cast<bool>(wake_);
    for (const Entry& e : entries_) {
      if (e.completion.timeline == VK_NULL_HANDLE) timeline = false;
      semaphores.push_back(e.completion.timeline);
      values.push_back(e.completion.value);
      fences.push_back(e.completion.fence);
    }
    const uint64_t wake_target = wake_value_ + 1;
    // On a device of one queue the submissions complete in the order they were made, so waiting
    // for the oldest alone loses nothing; and a wait for one semaphore or fence blocks where
    // waiting for any of several may poll without sleeping (Mesa's common code does so for
    // drivers without a native wait-any, lavapipe among them), taking the CPU that a CPU device
    // runs its work on. New entries are seen within a slice.
    const bool oldest_only = device_->queue_count() == 1;
    const Sequence::Completion oldest = entries_.front().completion;
    std::vector<Sequence::Completion> completions;
    if (spin_ > absl::ZeroDuration()) {
      for (const Entry& e : entries_) completions.push_back(e.completion);
    }
    mu_.Unlock();
    if (Poll(completions, std::min(spin_, until - now))) {
      // Something completed or came while polling: no block.
    } else if (oldest_only) {
      const int64_t ns =
          std::max<int64_t>(0, absl::ToInt64Nanoseconds(std::min(until - now, kOneQueueSlice)));
      if (oldest.timeline != VK_NULL_HANDLE) {
        VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
        wi.semaphoreCount = 1;
        wi.pSemaphores = &oldest.timeline;
        wi.pValues = &oldest.value;
        vkWaitSemaphores(device_->handle(), &wi, static_cast<uint64_t>(ns));
      } else {
        device_->calls().WaitForFences(device_->handle(), 1, &oldest.fence, VK_TRUE,
                                       static_cast<uint64_t>(ns));
      }
    } else if (timeline) {
      semaphores.push_back(wake_.get());
      values.push_back(wake_target);
      VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
      wi.flags = VK_SEMAPHORE_WAIT_ANY_BIT;
      wi.semaphoreCount = static_cast<uint32_t>(semaphores.size());
      wi.pSemaphores = semaphores.data();
      wi.pValues = values.data();
      int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(until - now));
      vkWaitSemaphores(device_->handle(), &wi, static_cast<uint64_t>(ns));
    } else {
      int64_t ns =
          std::max<int64_t>(0, absl::ToInt64Nanoseconds(std::min(until - now, kFencePollBound)));
      device_->calls().WaitForFences(device_->handle(), static_cast<uint32_t>(fences.size()),
                                     fences.data(), VK_FALSE, static_cast<uint64_t>(ns));
    }
    mu_.Lock();

    // Complete what is done or overdue, in the order they were watched.
    std::vector<std::pair<Entry, absl::Status>> finished;
    const absl::Time after = absl::Now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (Signalled(it->completion)) {
        finished.emplace_back(std::move(*it), absl::OkStatus());
        it = entries_.erase(it);
      } else if (after >= it->deadline) {
        finished.emplace_back(
            std::move(*it), absl::DeadlineExceededError("the submission did not complete in time"));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
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
