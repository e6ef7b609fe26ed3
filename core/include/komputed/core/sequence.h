#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

// An operation that a sequence records: komputed's one operation description
// (op_semantics.h) over core objects. It holds its objects, so they outlive the recording.
using Op = OpDesc<std::shared_ptr<Tensor>, std::shared_ptr<Algorithm>>;

// What Sequence::Record checks of an operation before recording it: its objects are present and
// on `device`, then the operation's rules (op_semantics.h). For callers that check a batch of
// operations before recording any.
absl::Status ValidateOp(const Op& op, const Device& device);

// The operations spelled by kind, as a caller writes them: Record(op::SyncToDevice{{a, b}}).
namespace op {
struct SyncToDevice {
  std::vector<std::shared_ptr<Tensor>> tensors;
  operator Op() const { return {OpKind::kSyncDevice, tensors}; }
};
struct SyncToHost {
  std::vector<std::shared_ptr<Tensor>> tensors;
  operator Op() const { return {OpKind::kSyncLocal, tensors}; }
};
struct Copy {
  std::vector<std::shared_ptr<Tensor>> tensors;
  operator Op() const { return {OpKind::kCopy, tensors}; }
};
struct Dispatch {
  std::shared_ptr<Algorithm> algorithm;
  std::optional<std::vector<uint8_t>> push_constants;
  operator Op() const { return {OpKind::kDispatch, {}, algorithm, push_constants}; }
};
struct MemoryBarrier {
  std::vector<std::shared_ptr<Tensor>> tensors;
  VkAccessFlags src_access = 0;
  VkAccessFlags dst_access = 0;
  VkPipelineStageFlags src_stage = 0;
  VkPipelineStageFlags dst_stage = 0;
  bool primary = true;
  operator Op() const {
    return {OpKind::kBarrier, tensors, nullptr, std::nullopt,
            BarrierMasks{src_access, dst_access, src_stage, dst_stage, primary}};
  }
};
}  // namespace op

// A command buffer on one queue with its fence (Kompute's Sequence). Recording appends to the
// command buffer; after a submission (or End, or Clear), the next Record starts a new command
// buffer. Submit/Wait may re-run the same commands any number of times. Thread-safe; Record,
// Submit, End, Clear and Rerecord fail with FAILED_PRECONDITION while a submission is in flight.
class Sequence {
 public:
  // total_timestamps > 0: a GPU timestamp before the first op and after each op, up to that
  // many; FAILED_PRECONDITION when the queue has no timestamps.
  static absl::StatusOr<std::unique_ptr<Sequence>> Create(std::shared_ptr<Device> device,
                                                          uint32_t queue,
                                                          uint32_t total_timestamps);
  ~Sequence();

  // Validates and records. On error nothing is recorded.
  absl::Status Record(Op op);
  // Submits what was recorded (ending the recording). OK and nothing submitted when nothing was
  // ever recorded. `prologue` (nullable): tensors' deferred inits, submitted ahead of the
  // commands in the same batch and held until the submission has completed; marked submitted
  // when the submission is made.
  absl::Status Submit(std::shared_ptr<TensorInitBatch> prologue = nullptr);
  // A sequence to submit with others (SubmitTogether), and its prologue (nullable, as Submit's).
  struct Submission {
    Sequence* sequence = nullptr;
    std::shared_ptr<TensorInitBatch> prologue;
  };
  // Submits several distinct sequences of one device and queue in one vkQueueSubmit, in their
  // order, each as Submit would. One that cannot be submitted (running, or an algorithm rebuilt
  // since it was recorded) gets its own error and the others go. Only the last one's fence
  // signals; the others' submissions are followed through their timeline semaphores (InFlight,
  // Poll, Wait). Without timeline semaphores, or for sequences of different queues, each is
  // submitted alone. Returns each one's status, in the order of `batch`.
  static std::vector<absl::Status> SubmitTogether(absl::Span<const Submission> batch)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Waits for the submission; DEADLINE_EXCEEDED (still running) after `timeout`. Then runs the
  // ops' host steps. OK when nothing is in flight.
  absl::Status Wait(absl::Duration timeout);
  absl::Status Eval(absl::Duration timeout) {
    absl::Status s = Submit();
    return s.ok() ? Wait(timeout) : s;
  }
  // Ends the recording (Kompute's end()): what was recorded stays and runs at the next Submit;
  // the next Record starts a new command buffer. OK when not recording.
  absl::Status End();
  // Drops the recorded ops (their host steps, and what Rerecord would record) and ends the
  // recording. As in Kompute 0.9, the command buffer already recorded stays: Submit still runs its
  // commands, without host steps, until the next Record starts a new one.
  absl::Status Clear();
  // Records every op recorded since the last Clear again (after an algorithm rebuild).
  absl::Status Rerecord();

  // Gives back the command buffer and its pool (the driver's memory for the commands) while the
  // sequence is neither running nor recording; the next Submit records the same commands again
  // first (the same tensors, algorithm builds and push constants, and after a Clear still without
  // host steps), and the next Record starts in a new buffer as it would have. Only a sequence
  // last recorded or submitted before `unused_since`. Returns whether anything was given back.
  bool Release(absl::Time unused_since = absl::InfiniteFuture());
  // Whether the command buffer has been given back (Release) and not yet made again.
  bool IsReleased() const;

  bool IsRunning() const;
  // The operations in the command buffer: what a submission runs (after a Clear, without their
  // host steps).
  std::vector<Op> RecordedOps() const;
  // Polls the submission in flight (yielding the core between polls) until it has completed or
  // `limit` has passed; returns whether it has completed. Wait still collects the result.
  bool Poll(absl::Duration limit) const;
  bool IsRecording() const;
  // Whether a Submit now would submit anything: false while nothing has been recorded.
  bool HasCommands() const;
  // The timestamps of the last completed submission, in nanoseconds.
  std::vector<uint64_t> Timestamps() const;
  size_t queue() const { return queue_; }
  // What signals when the submission in flight completes (for completion waiters): its fence,
  // and, where the device has timeline semaphores, a semaphore and the value it will reach.
  // Nothing is in flight where `running` is false.
  struct Completion {
    bool running = false;  // a submission is in flight (the rest is empty otherwise)
    // Its fence; VK_NULL_HANDLE for a submission that shared its vkQueueSubmit with later ones
    // (SubmitTogether), which only its timeline semaphore follows.
    VkFence fence = VK_NULL_HANDLE;
    VkSemaphore timeline = VK_NULL_HANDLE;
    uint64_t value = 0;
    uint64_t order = 0;  // its place among its queue's submissions (Device::Submit)
  };
  Completion InFlight() const;
  Device& device() const { return *device_; }

 private:
  Sequence() = default;
  absl::Status ValidateLocked(const Op& op) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the command pool and buffer when they were given back (or never made).
  absl::Status AllocateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records cb_ops_ again into a new command buffer, ended; on error the sequence stays released.
  absl::Status ReplayLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `push_constants` (not null): a dispatch's values as recorded before (ReplayLocked).
  void RecordLocked(Op& op, const std::vector<uint8_t>* push_constants = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Submit does before the vkQueueSubmit: the command buffer to submit, ended (recorded
  // again first where it was given back), or VK_NULL_HANDLE when nothing was ever recorded.
  absl::StatusOr<VkCommandBuffer> ReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What follows a successful vkQueueSubmit of the sequence at its queue's place `order`
  // (signalling its timeline to timeline_value_ + 1, and its fence where `fenced`).
  void SubmittedLocked(std::shared_ptr<TensorInitBatch> prologue, uint64_t order, bool fenced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submit's and SubmitTogether's work once every sequence of `batch` is locked: each one's
  // status goes to `statuses` (OK where left alone).
  static void SubmitLockedTogether(absl::Span<const Submission> batch,
                                   absl::Span<absl::Status> statuses)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Waits for the submission in flight: its fence, or its timeline value where it has none.
  absl::Status WaitInFlightLocked(absl::Duration timeout) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  std::shared_ptr<Device> device_;
  size_t queue_ = 0;
  uint32_t total_timestamps_ = 0;

  mutable absl::Mutex mu_;
  CommandPoolHandle pool_ ABSL_GUARDED_BY(mu_);               // empty while released
  VkCommandBuffer cb_ ABSL_GUARDED_BY(mu_) = VK_NULL_HANDLE;  // freed with pool_
  FenceHandle fence_;
  QueryPoolHandle query_pool_;
  SemaphoreHandle timeline_;
  uint64_t timeline_value_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t submit_order_ ABSL_GUARDED_BY(mu_) = 0;  // of the submission in flight
  bool fenced_ ABSL_GUARDED_BY(mu_) = true;         // its fence signals (SubmitTogether)
  // The last Record or Rerecord, or the end of the last submission (Wait: a submission keeps the
  // sequence running, which Release refuses, until then).
  absl::Time last_used_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::vector<Op> all_ops_ ABSL_GUARDED_BY(mu_);  // since the last Clear
  std::vector<Op> cb_ops_ ABSL_GUARDED_BY(mu_);   // in the command buffer
  struct Recorded {
    const Algorithm* algorithm = nullptr;
    std::shared_ptr<const void> pipeline;  // keeps the recorded pipeline alive
    uint64_t generation = 0;               // the build that was recorded
    std::vector<uint8_t> push_constants;   // the values recorded
  };
  std::vector<Recorded> cb_keep_ ABSL_GUARDED_BY(mu_);              // one per recorded dispatch
  std::shared_ptr<TensorInitBatch> prologue_ ABSL_GUARDED_BY(mu_);  // of the submission in flight
  bool recording_ ABSL_GUARDED_BY(mu_) = false;
  bool host_steps_ ABSL_GUARDED_BY(mu_) = true;  // false once the command buffer was cleared
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t timestamps_written_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> timestamps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::core
