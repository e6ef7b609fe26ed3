#pragma once
// The client's side of a sequence on a komputed daemon.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "backend.h"
#include "komputed/core/op_semantics.h"
#include "komputed/v1/komputed.pb.h"
#include "remote/connection.h"
#include "remote/objects.h"

namespace kp::internal::remote {

// A sequence of the session. Records are checked here by core's rules and kept until the next
// submission, which sends them with the host data that goes up and brings back what comes back
// (op_semantics.h). Thread-safe. Destroying it queues its destroy and does not wait for a
// submission in flight (the daemon finishes it; its results are dropped).
class RemoteSequence final : public BackendSequence {
 public:
  RemoteSequence(const void* owner, std::shared_ptr<Connection> connection, uint64_t handle);
  ~RemoteSequence() override;

  absl::Status Record(const Op& op) override;
  absl::Status Submit() override;
  absl::Status Wait(absl::Duration timeout) override;
  // One unary round trip (plus streams for large data).
  absl::Status Eval(absl::Duration timeout) override;
  absl::Status End() override;
  absl::Status Clear() override;
  absl::Status Rerecord() override;
  bool IsRunning() const override;
  bool IsRecording() const override;
  std::vector<uint64_t> Timestamps() const override;

 private:
  // An operation as recorded: in remote objects, and as sent.
  struct Recorded {
    komputed::core::OpDesc<std::shared_ptr<RemoteTensor>, std::shared_ptr<RemoteAlgorithm>> op;
    komputed::v1::Operation wire;
  };

  // Encodes `r` with the push constants of this moment (applying an override to its algorithm).
  static absl::Status Encode(Recorded& r);
  absl::StatusOr<komputed::v1::EvalRequest> PrepareLocked();
  absl::Status FinishLocked(const komputed::v1::EvalResponse& response);

  const std::shared_ptr<Connection> connection_;
  const uint64_t handle_;
  mutable std::mutex mu_;
  komputed::v1::RecordRequest actions_;  // not yet sent: they go with this sequence's next eval
  std::vector<Recorded> all_ops_;        // since the last clear
  std::vector<Recorded> cb_ops_;         // in the current batch (kept by a clear)
  bool recording_ = false;
  bool host_steps_ = true;  // false once the batch was cleared
  // Ended here while the daemon's sequence still records: the next record begins a new batch
  // there with a clear (which keeps what was recorded, as an end does).
  bool end_pending_ = false;
  std::shared_ptr<Connection::Pending> in_flight_;
  std::map<uint64_t, std::shared_ptr<RemoteTensor>> inline_downloads_;
  std::vector<std::shared_ptr<RemoteTensor>> streamed_downloads_;
  std::vector<uint64_t> timestamps_;
};

}  // namespace kp::internal::remote
