#pragma once
// Tensor data moved in bulk between the client and a komputed daemon: the WriteTensor and
// ReadTensor streams, split over parallel connections for large transfers.

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "remote/credentials.h"

namespace kp::internal::remote {

// The bulk data path of one session. Thread-safe; each call blocks until its transfer has ended
// (bounded by a deadline that grows with the size). Owned by the session's Connection.
class BulkTransfer {
 public:
  // `channel` is the session's; further lanes open channels of their own, with the session's
  // `credentials`, to the daemon's `direct_address` (OpenSessionResponse), else to `address`.
  // Over TLS a lane checks the daemon's certificate against `tls_name` when it is set (the DNS
  // name that `address` was resolved from), else against the host of `address` where it goes
  // to the direct address.
  // The number of lanes is $KOMPUTED_TRANSFER_STREAMS (1 to 16), else a quarter of the cores, 1
  // to 4. A further lane that does not reach the session's daemon (UNAVAILABLE, or NOT_FOUND
  // from another daemon behind a balancer) moves its range over `channel`, and the session's
  // transfers use `channel` alone from then on.
  BulkTransfer(std::string address, std::string tls_name,
               std::shared_ptr<const ClientCredentials> credentials,
               std::shared_ptr<grpc::Channel> channel, std::string session_id,
               std::string direct_address);

  // Streams `bytes` of host data into the tensor `handle`.
  absl::Status Write(uint64_t handle, const uint8_t* data, uint64_t bytes);
  // Reads the tensor's whole host data (`bytes`) into `data`.
  absl::Status Read(uint64_t handle, uint8_t* data, uint64_t bytes);

 private:
  template <typename Move>
  absl::Status InLanes(uint64_t bytes, Move move);
  grpc::GenericStub& LaneStub(uint64_t lane);
  absl::Status WriteRange(grpc::GenericStub& stub, uint64_t handle, const uint8_t* data,
                          uint64_t begin, uint64_t end);
  absl::Status ReadRange(grpc::GenericStub& stub, uint64_t handle, uint8_t* data, uint64_t begin,
                         uint64_t end);

  const std::string lane_address_;  // where further lanes connect
  // Over TLS, the name that the daemon's certificate is checked against on a lane to its direct
  // address, or on any lane when the session's address was resolved from a DNS name: the host
  // that the session was opened with (empty: the lane address's own).
  const std::string lane_tls_name_;
  const std::shared_ptr<const ClientCredentials> credentials_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::string session_id_;
  const uint32_t lanes_;
  std::atomic<bool> single_lane_{false};  // set once a further lane missed the session's daemon
  absl::Mutex mu_;
  std::vector<std::unique_ptr<grpc::GenericStub>> lane_stubs_
      ABSL_GUARDED_BY(mu_);  // [0]: channel_
};

}  // namespace kp::internal::remote
