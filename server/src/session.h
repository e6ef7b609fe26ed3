#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <grpcpp/support/byte_buffer.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device_pool.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/sequence.h"
#include "komputed/core/tensor.h"
#include "komputed/v1/komputed.pb.h"
#include "komputed/v1/tensor_chunk_wire.h"
#include "metrics.h"
#include "work_gate.h"

namespace komputed::server {

// What a session is given when it opens.
struct SessionConfig {
  std::string id;
  PooledDevice* device = nullptr;  // the pool outlives every session
  // The opening of the device that this session's objects live on (device->instance() when the
  // session was opened); kept when the device is lost and opened again.
  std::shared_ptr<DeviceInstance> instance;
  std::vector<uint32_t> queues;    // session queue i → device queue queues[i]
  std::string client_name;
  std::string peer;
  absl::Duration eval_timeout = absl::Seconds(600);  // when an eval names none
  uint64_t max_message_bytes = 64 << 20;             // the daemon's largest message
  Metrics* metrics = nullptr;                        // required; outlives every session
  WorkGate* gate = nullptr;                          // admits evaluations; null: always admitted
  // A unary eval waits this long for its submission on the calling thread before handing it to
  // the device's waiter (saves a thread hand-off for short work); zero: always hand it off.
  absl::Duration inline_wait = absl::ZeroDuration();
  int inline_waiters = 2;  // at most this many calling threads wait inline per device
  // Of the inline wait: polling the fence before blocking on it (skipped on CPU devices).
  absl::Duration spin = absl::ZeroDuration();
};

// One client's session on one device: its handle tables (tensors, algorithms, sequences, named
// by client-chosen 64-bit handles, one table per kind) and every command that acts on them. The
// RPC handlers only look a session up and call it.
//
// Owned by the SessionManager (and, while a call runs, by that call through a shared_ptr). Close()
// frees everything; afterwards every call fails with NOT_FOUND. Submissions in flight at that
// time are held by the device's CompletionWaiter until they complete.
//
// Thread-safe: one mutex guards the tables; it is never held while waiting for the device.
// Errors name the object and the value at fault; a failing call changes nothing (except that the
// commands of an eval before the failing one stay applied).
class Session {
 public:
  explicit Session(SessionConfig config);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return config_.id; }
  const std::string& client_name() const { return config_.client_name; }
  PooledDevice& device() const { return *config_.device; }
  uint32_t queue_count() const { return static_cast<uint32_t>(config_.queues.size()); }
  absl::Time created() const { return created_; }

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

  absl::Status CreateTensor(const v1::CreateTensorRequest& request);
  absl::Status DestroyTensor(const v1::DestroyTensorRequest& request);
  absl::Status CreateAlgorithm(const v1::CreateAlgorithmRequest& request);
  absl::Status RebuildAlgorithm(const v1::CreateAlgorithmRequest& request);
  absl::Status SetPushConstants(const v1::SetPushConstantsRequest& request);
  absl::Status DestroyAlgorithm(const v1::DestroyAlgorithmRequest& request);
  absl::Status CreateSequence(const v1::CreateSequenceRequest& request);
  absl::Status Record(const v1::RecordRequest& request);
  absl::Status DestroySequence(const v1::DestroySequenceRequest& request);
  absl::StatusOr<std::vector<uint64_t>> GetTimestamps(uint64_t sequence);

  // Runs an eval: its commands in order (stopping at the first failure), its uploads, its
  // submission; then, once the device has finished (on the device's waiter thread, or at once
  // when nothing was submitted), fills `response` with the downloads and timestamps and calls
  // done(status) exactly once. `response` must stay valid until then. The wait is bounded by
  // the request's timeout_ms (or the daemon's default) and by `deadline`. While the daemon
  // drains (the gate is closed) it is refused with UNAVAILABLE and changes nothing.
  // `may_wait_inline`: the caller's thread may wait up to the configured inline_wait for the
  // submission (and then call done on it); a stream that pipelines evals passes false.
  void Eval(const v1::EvalRequest& request, absl::Time deadline, v1::EvalResponse* response,
            bool may_wait_inline, std::function<void(absl::Status)> done);

  // A tensor whose host data a WriteTensor/ReadTensor call accesses: NOT_FOUND, or
  // FAILED_PRECONDITION for a storage tensor (it has no host data).
  absl::StatusOr<std::shared_ptr<core::Tensor>> HostTensor(uint64_t handle);

  void Describe(v1::SessionInfo* info) const;

  // Counts tensor data moved between the client and the daemon (komputed_bytes_transferred_total).
  void CountUpload(uint64_t bytes) const { uploads_->Increment(static_cast<double>(bytes)); }
  void CountDownload(uint64_t bytes) const { downloads_->Increment(static_cast<double>(bytes)); }

 private:
  // A sequence and whether an eval's completion is pending for it in the waiter.
  struct SequenceEntry {
    std::shared_ptr<core::Sequence> sequence;
    std::atomic<bool> awaited{false};
  };
  struct Prepared;  // what an eval hands to the waiter

  absl::Status CheckOpenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Open, and its device instance not lost: what creating, recording and evaluating need.
  absl::Status CheckUsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<core::Tensor>> TensorLocked(uint64_t handle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<core::Tensor>> HostTensorLocked(uint64_t handle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<std::shared_ptr<core::Tensor>>> TensorsLocked(
      const google::protobuf::RepeatedField<uint64_t>& handles) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<core::Algorithm>> AlgorithmLocked(uint64_t handle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<SequenceEntry>> SequenceLocked(uint64_t handle) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when the sequence can take a new recording or submission: nothing in flight, or a
  // submission that timed out earlier has completed since.
  absl::Status SettleLocked(uint64_t handle, SequenceEntry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<core::AlgorithmSpec> SpecLocked(const v1::CreateAlgorithmRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<core::Op> OpLocked(const v1::Operation& operation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CreateTensorLocked(const v1::CreateTensorRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroyTensorLocked(const v1::DestroyTensorRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateAlgorithmLocked(const v1::CreateAlgorithmRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RebuildAlgorithmLocked(const v1::CreateAlgorithmRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetPushConstantsLocked(const v1::SetPushConstantsRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroyAlgorithmLocked(const v1::DestroyAlgorithmRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateSequenceLocked(const v1::CreateSequenceRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordLocked(const v1::RecordRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DestroySequenceLocked(const v1::DestroySequenceRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommandLocked(const v1::Command& command) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commands, checks, uploads and the submission of an eval.
  absl::StatusOr<Prepared> PrepareEvalLocked(const v1::EvalRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void AddMemory(int64_t bytes);
  // Counts an algorithm build by whether its SPIR-V passed validation.
  void CountValidation(const absl::Status& build) const;

  const SessionConfig config_;
  prometheus::Counter* const uploads_;
  prometheus::Counter* const downloads_;
  const absl::Time created_;
  std::atomic<int64_t> last_activity_ns_;
  std::atomic<int> users_{0};
  std::atomic<uint64_t> memory_bytes_{0};

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<core::Algorithm>> algorithms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<SequenceEntry>> sequences_ ABSL_GUARDED_BY(mu_);
};

// One WriteTensor call: the first chunk declares the session, tensor and range
// [offset, offset + total_bytes); the chunks, in any order and without overlap, must cover it
// exactly. Each chunk is written into the tensor's host data as it arrives. Not thread-safe (one
// call's chunks arrive one at a time).
class TensorWrite {
 public:
  // A chunk as it arrived: its fields, and its data as pieces of the received message
  // (v1::wire::ParseTensorChunk), so that it is copied once, into the tensor.
  using Chunk = v1::wire::TensorChunkView;

  // Checks the first chunk's declaration and writes its data.
  static absl::StatusOr<std::unique_ptr<TensorWrite>> Begin(std::shared_ptr<Session> session,
                                                            const Chunk& first);
  absl::Status Write(const Chunk& chunk);
  // INVALID_ARGUMENT unless the chunks covered the declared range exactly.
  absl::Status Finish() const;
  uint64_t bytes_written() const { return written_; }

 private:
  TensorWrite() = default;

  std::shared_ptr<Session> session_;
  std::shared_ptr<core::Tensor> tensor_;
  uint64_t handle_ = 0;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
  uint64_t written_ = 0;
  std::map<uint64_t, uint64_t> ranges_;  // written [start, end), adjacent ones merged
};

// One ReadTensor call: a range of a tensor's host data, handed out in chunks. Not thread-safe.
class TensorRead {
 public:
  // The default chunk size: 4 MiB messages, so that a client with gRPC's default 4 MiB receive
  // limit can take them.
  static constexpr uint64_t kDefaultChunkBytes = (4 << 20) - 1024;

  // chunk_bytes is capped to max_chunk_bytes. INVALID_ARGUMENT for a range outside the tensor.
  static absl::StatusOr<std::unique_ptr<TensorRead>> Begin(std::shared_ptr<Session> session,
                                                           const v1::ReadTensorRequest& request,
                                                           uint64_t max_chunk_bytes);
  bool done() const { return next_ >= end_; }
  // The next chunk (call while !done()) as a serialized TensorChunk {handle, offset, data}, its
  // data not copied: the message refers to the tensor's host data, and holds the tensor until
  // gRPC has sent it.
  grpc::ByteBuffer Next();

 private:
  TensorRead() = default;

  std::shared_ptr<Session> session_;
  std::shared_ptr<core::Tensor> tensor_;
  uint64_t handle_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  uint64_t chunk_bytes_ = 0;
};

}  // namespace komputed::server
