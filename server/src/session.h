#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "device_pool.h"
#include "eval.h"
#include "handle_table.h"
#include "host_writes.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shared_memory.h"
#include "komputed/core/tensor.h"
#include "metrics.h"
#include "quota.h"
#include "server_options.h"
#include "session_requests.h"
#include "watchdog.h"
#include "work_gate.h"

namespace komputed::server {

// What is particular to one session, given when it opens.
struct SessionFacts {
  std::string id;
  PooledDevice* device = nullptr;  // the pool outlives every session
  // The opening of the device that this session's objects live on (device->instance() when the
  // session was opened); kept when the device is lost and opened again.
  std::shared_ptr<DeviceInstance> instance;
  std::vector<uint32_t> queues;  // session queue i → device queue queues[i]
  std::string client_name;
  std::string peer;
  // The tenant that owns the session, whose quotas bound it; null: no quotas (tests).
  std::shared_ptr<TenantAccount> account;
  // The kernel watchdog that follows the session's submissions; null: none.
  std::shared_ptr<Watchdog> watchdog;
  // The ticket with which its client passes shared memory (SessionManager); empty: not offered.
  std::string shared_memory_ticket;
};

// One client's session on one device: its handle tables (tensors, algorithms, sequences, named
// by client-chosen 64-bit handles, one table per kind) and every command that acts on them, in
// komputed's own terms (session_requests.h, eval.h); the service edge converts the wire
// (session_wire.h).
//
// Owned by the SessionManager (and, while a call runs, by that call through a shared_ptr). The
// options, metrics and gate (null: always admitted) outlive every session. Close() frees
// everything; afterwards every call fails with NOT_FOUND. Submissions in flight at that time are
// held by the device's CompletionWaiter until they complete.
//
// Thread-safe: one mutex guards the tables; it is never held while waiting for the device. Who
// changes the tensors' host data, and when, follows one rule (host_writes.h): host writes whole
// under a lock, submissions marked while in flight, reads of one moment or none.
// Errors name the object and the value at fault; a failing call changes nothing (except that the
// commands of an eval before the failing one stay applied).
class Session {
 public:
  // `session_charge`: the session's place in its tenant's sessions quota, given back by Close().
  Session(SessionFacts facts, const ServerOptions& options, Metrics* metrics, WorkGate* gate,
          Charge session_charge = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return facts_.id; }
  const std::string& client_name() const { return facts_.client_name; }
  // The owning tenant's name ("" without an account).
  const std::string& tenant() const;
  PooledDevice& device() const { return *facts_.device; }
  uint32_t queue_count() const { return static_cast<uint32_t>(facts_.queues.size()); }
  // Session queue i → device queue queues()[i].
  const std::vector<uint32_t>& queues() const { return facts_.queues; }
  absl::Time created() const { return created_; }
  const std::shared_ptr<DeviceInstance>& instance() const { return facts_.instance; }
  const std::string& shared_memory_ticket() const { return facts_.shared_memory_ticket; }
  // Whether Close has not been called yet.
  bool open() const;

  // Keeps `memory`, passed by the client on the shared-memory socket, as region `region` until a
  // tensor is made over it (TensorRequest::shared_memory) or the session closes. Imports it into
  // the device first. INVALID_ARGUMENT for region 0 or memory the device does not take
  // (UNIMPLEMENTED where it cannot import host memory); ALREADY_EXISTS for a region held already;
  // RESOURCE_EXHAUSTED past kMaxSharedMemoryWaiting regions not yet taken; NOT_FOUND once closed.
  static constexpr size_t kMaxSharedMemoryWaiting = 64;
  absl::Status AttachSharedMemory(uint64_t region, std::shared_ptr<core::SharedMemory> memory);

  // Liveness: every call touches the session; BeginUse/EndUse bracket a call, stream or eval in
  // progress (SessionManager::Get does both), which keeps it alive however long it takes.
  void Touch();
  absl::Time last_activity() const;
  void BeginUse() { users_.fetch_add(1, std::memory_order_relaxed); }
  void EndUse() {
    Touch();
    users_.fetch_sub(1, std::memory_order_release);  // publishes the touch
  }
  // Read it before last_activity(): a 0 here comes with the last EndUse's touch.
  int users() const { return users_.load(std::memory_order_acquire); }
  // Tensor memory held (bytes; a kDevice tensor counts twice: device buffer and staging).
  uint64_t memory_bytes() const { return memory_bytes_.load(std::memory_order_relaxed); }

  // Frees every object (idempotent). Later calls fail with NOT_FOUND.
  void Close();
  // Gives back the command buffers of the sequences neither recorded nor submitted since
  // `unused_since` (core::Sequence::Release); returns how many.
  size_t ReleaseIdleSequences(absl::Time unused_since);

  absl::Status CreateTensor(const TensorRequest& request);
  absl::Status DestroyTensor(uint64_t handle);
  absl::Status CreateAlgorithm(const AlgorithmRequest& request);
  absl::Status RebuildAlgorithm(const AlgorithmRequest& request);
  absl::Status SetPushConstants(const PushConstantsRequest& request);
  absl::Status DestroyAlgorithm(uint64_t handle);
  absl::Status CreateSequence(const SequenceRequest& request);
  // Resolves every action's handles first (a bad one records nothing), then applies them in
  // order; core::Sequence::Record checks each operation's rules.
  absl::Status Record(const RecordRequest& request);
  absl::Status DestroySequence(uint64_t handle);
  absl::StatusOr<std::vector<uint64_t>> GetTimestamps(uint64_t sequence);

  using EvalDone = std::function<void(absl::StatusOr<EvalResult>)>;
  // Runs an eval (eval.cc): its commands in order (stopping at the first failure), its uploads,
  // its submission; then, once the device has finished (on the device's waiter thread, or at once
  // when nothing was submitted), calls done exactly once with the downloads and timestamps or
  // the error. The wait is bounded by the plan's timeout (or the daemon's eval_timeout) and by
  // `deadline`. While the daemon drains (the gate is closed) it is refused with UNAVAILABLE and
  // changes nothing. `may_wait_inline`: the caller's thread may wait up to the daemon's
  // eval_inline_wait for the submission (and then call done on it); a stream that pipelines
  // evals passes false. The plan is read only before Eval returns.
  void Eval(const EvalPlan& plan, absl::Time deadline, bool may_wait_inline, EvalDone done);
  // Runs `plans` in their order as Eval runs each (without a deadline of the caller's, never
  // waiting inline), calling dones[i] for plans[i]. Where the daemon submits together
  // (--submit_together), consecutive evals that each submit a sequence of one queue, carry no
  // commands and upload nothing into a tensor that an earlier one of them submits go to the
  // device in one vkQueueSubmit: what each eval sees is what it would see submitted alone.
  // `cancelled` (optional) is asked before each run: once it says yes, the evals not run yet are
  // answered CANCELLED and change nothing.
  void EvalMany(absl::Span<const EvalPlan> plans, std::vector<EvalDone> dones,
                const std::function<bool()>& cancelled = nullptr);

  // A tensor whose host data a WriteTensor/ReadTensor call accesses: NOT_FOUND, or
  // FAILED_PRECONDITION for a storage tensor (it has no host data).
  absl::StatusOr<std::shared_ptr<core::Tensor>> HostTensor(uint64_t handle);
  // Writes `pieces` into the host data of tensor `handle`, which must still be `tensor`
  // (HostTensor's), at once under the session's lock (tensor_io.cc): WriteTensor's commit.
  // NOT_FOUND when the tensor was destroyed meanwhile (nothing is written).
  absl::Status WriteHostData(uint64_t handle, const core::Tensor& tensor,
                             const std::vector<StagedWrite>& pieces);
  // Who changes the host data of the session's tensors, and when (host_writes.h).
  HostWrites& host_writes() const { return *host_writes_; }
  // Host memory that a call holds while it lasts (WriteTensor's staging), taken from the tenant's
  // host_memory_bytes quota; nothing to take without an account.
  absl::StatusOr<Charge> ChargeHostMemory(uint64_t bytes) const {
    if (facts_.account == nullptr) return Charge();
    return facts_.account->Take(Counted::kHostMemory, bytes);
  }

  SessionSummary Describe() const;

  // Counts tensor data moved between the client and the daemon (komputed_bytes_transferred_total).
  void CountUpload(uint64_t bytes) const { uploads_->Increment(static_cast<double>(bytes)); }
  void CountDownload(uint64_t bytes) const { downloads_->Increment(static_cast<double>(bytes)); }

 private:
  // A sequence and whether an eval's completion is pending for it in the waiter.
  struct SequenceEntry {
    std::shared_ptr<core::Sequence> sequence;
    std::atomic<bool> awaited{false};
    uint64_t ops = 0;  // operations recorded since the last clear (guarded by the session's mu_)
  };
  struct Prepared;  // what an eval hands to the waiter (eval.cc)
  struct Admitted;  // an eval let in: its place in the quota and the drain gate (eval.cc)
  struct Together;  // evals prepared whose submissions go to the device together (eval.cc)

  absl::Status CheckOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Open, and its device instance not lost: what creating, recording and evaluating need.
  absl::Status CheckUsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<core::Tensor>> HostTensorLocked(uint64_t handle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<std::shared_ptr<core::Tensor>>> TensorsLocked(
      const std::vector<uint64_t>& handles) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the sequence can take a new recording or submission: nothing in flight, or a
  // submission that timed out earlier has completed since.
  absl::Status SettleLocked(uint64_t handle, SequenceEntry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request's spec over the session's tensors, within the source_bytes quota; GLSL is not
  // compiled yet (Compiled does that).
  absl::StatusOr<core::AlgorithmSpec> SpecLocked(const AlgorithmRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The operation over this session's objects.
  absl::StatusOr<core::Op> OpLocked(const HandleOp& op) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CreateTensorLocked(const TensorRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroyTensorLocked(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateAlgorithmLocked(const AlgorithmRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RebuildAlgorithmLocked(const AlgorithmRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetPushConstantsLocked(const PushConstantsRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroyAlgorithmLocked(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateSequenceLocked(const SequenceRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordLocked(const RecordRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroySequenceLocked(uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommandLocked(const SessionCommand& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commands, checks, uploads and the submission of an eval (eval.cc).
  // With `together`, the submission is left to SubmitTogetherLocked, which fills in the rest of
  // prepared[index] (the plan must be one that Joins allows).
  absl::StatusOr<Prepared> PrepareEvalLocked(const EvalPlan& plan, Together* together = nullptr,
                                             size_t index = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What follows an eval's submission (`submitted`: its status) in its Prepared.
  absl::Status SubmittedLocked(uint64_t handle, const absl::Status& submitted, bool inits,
                               Prepared& prepared) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `plan` may be submitted together with others at all, and with those of `together`.
  bool CanGoTogetherLocked(const EvalPlan& plan) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool JoinsLocked(const EvalPlan& plan, const Together& together) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submits the evals of `together` in one vkQueueSubmit and empties it.
  void SubmitTogetherLocked(Together& together, std::vector<absl::StatusOr<Prepared>>& prepared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets an eval in (counts it in the drain gate and takes its place in the tenant's
  // inflight_submissions quota), or tells `done` why not.
  std::optional<Admitted> Admit(const EvalPlan& plan, EvalDone done);
  // The rest of an eval once prepared (and submitted): the answer at once where nothing was
  // submitted, else the inline wait or the hand-off to the completion waiter.
  void Proceed(const EvalPlan& plan, Admitted admitted, absl::StatusOr<Prepared> prepared,
               absl::Time deadline, bool may_wait_inline);

  void AddMemory(int64_t bytes);
  // For a sequence leaving the tables: while its submission may still run, the device's waiter
  // holds it until that has completed, so that it is freed without waiting on the device.
  void ReleaseSequence(const std::shared_ptr<SequenceEntry>& entry) const;
  // RESOURCE_EXHAUSTED when one more object would pass the objects_per_session quota.
  absl::Status CheckNewObjectLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when the algorithm's dispatch (workgroups × local size) is over the
  // dispatch_invocations quota.
  absl::Status CheckDispatchQuota(const core::AlgorithmSpec& spec) const;
  // The spec with its GLSL compiled (no lock needed: it can take long), within the dispatch
  // quota.
  absl::StatusOr<core::AlgorithmSpec> Compiled(const AlgorithmRequest& request,
                                               core::AlgorithmSpec spec) const;
  // Compiled, then the algorithm built on the session's device.
  absl::StatusOr<std::shared_ptr<core::Algorithm>> Built(const AlgorithmRequest& request,
                                                         core::AlgorithmSpec spec) const;
  // The word that the session's algorithms read to be stopped (made on first use).
  absl::StatusOr<std::shared_ptr<core::CancelWord>> CancelWordLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long one submission may run: the daemon's max_kernel_time, lowered by the tenant's
  // kernel_time_ms quota.
  absl::Duration KernelTimeLimit() const;
  // Counts an algorithm build by whether its SPIR-V passed validation.
  void CountValidation(const absl::Status& build) const;

  const SessionFacts facts_;
  // Its tenant's pool for small tensors' memory on its device opening; null: none.
  const std::shared_ptr<core::MemoryPool> memory_pool_;
  const ServerOptions& options_;
  Metrics* const metrics_;
  WorkGate* const gate_;
  prometheus::Counter* const uploads_;
  prometheus::Counter* const downloads_;
  prometheus::Counter* const submitted_together_;
  const absl::Time created_;
  std::atomic<int64_t> last_activity_ns_;
  std::atomic<int> users_{0};
  std::atomic<uint64_t> memory_bytes_{0};
  // Shared with the completion callbacks of the session's submissions.
  const std::shared_ptr<HostWrites> host_writes_ = std::make_shared<HostWrites>();

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  Charge session_charge_ ABSL_GUARDED_BY(mu_);
  HandleTable<std::shared_ptr<core::Tensor>> tensors_ ABSL_GUARDED_BY(mu_){"tensor"};
  HandleTable<std::shared_ptr<core::Algorithm>> algorithms_ ABSL_GUARDED_BY(mu_){"algorithm"};
  HandleTable<std::shared_ptr<SequenceEntry>> sequences_ ABSL_GUARDED_BY(mu_){"sequence"};
  // Tensors whose device memory has not had its first contents yet (core::TensorInit::kDeferred):
  // the next submission carries their inits ahead of its commands.
  std::vector<std::weak_ptr<core::Tensor>> pending_init_ ABSL_GUARDED_BY(mu_);
  // Shared memory passed for tensors not made yet, by region.
  absl::flat_hash_map<uint64_t, core::HostMemory> shared_memory_ ABSL_GUARDED_BY(mu_);
  mutable std::shared_ptr<core::CancelWord> cancel_ ABSL_GUARDED_BY(mu_);  // made on first use
};

}  // namespace komputed::server
