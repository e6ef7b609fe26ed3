#pragma once
// The client's side of a tensor and an algorithm on a komputed daemon.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "backend.h"
#include "komputed/core/op_semantics.h"
#include "remote/connection.h"

namespace kp::internal::remote {

// A tensor of the session, with its host data kept here (none for storage tensors). Thread-safe;
// the host data is the caller's to synchronise. Destroying it queues its destroy on the
// connection (no I/O).
class RemoteTensor final : public BackendTensor {
 public:
  // `spec.element_size` is resolved (not 0).
  // With `shared`, the host data is that memory, which the daemon holds too (the tensor was made
  // over it): it never crosses the socket.
  RemoteTensor(const void* owner, std::shared_ptr<Connection> connection, uint64_t handle,
               const TensorSpec& spec,
               std::shared_ptr<komputed::core::SharedMemory> shared = nullptr);
  ~RemoteTensor() override;
  void* host_data() override { return host_; }
  uint8_t* host() const { return host_; }
  bool shared() const { return shared_ != nullptr; }
  uint64_t handle() const { return handle_; }
  uint64_t bytes() const { return spec_.count * spec_.element_size; }
  const TensorSpec& spec() const { return spec_; }
  // What core's operation rules need to know of it.
  komputed::core::TensorFacts facts() const;

 private:
  std::shared_ptr<Connection> connection_;
  const uint64_t handle_;
  const TensorSpec spec_;
  std::unique_ptr<uint8_t[]> owned_;
  const std::shared_ptr<komputed::core::SharedMemory> shared_;
  uint8_t* host_ = nullptr;  // owned_, shared_'s memory, or none
};

// An algorithm of the session: its tensors and its push constants as the client knows them (the
// values that a dispatch recorded now would send). Thread-safe. Destroying it queues its destroy
// (no I/O).
class RemoteAlgorithm final : public BackendAlgorithm {
 public:
  RemoteAlgorithm(const void* owner, std::shared_ptr<Connection> connection, uint64_t handle);
  ~RemoteAlgorithm() override;
  uint64_t handle() const { return handle_; }
  std::vector<std::shared_ptr<RemoteTensor>> tensors() const;
  // After a (re)build on the daemon.
  void Built(std::vector<std::shared_ptr<RemoteTensor>> tensors, std::vector<uint8_t> push);
  std::vector<uint8_t> PushConstants() const override;
  // After SetPushConstants on the daemon (whose size was checked).
  void SetPushConstants(std::vector<uint8_t> push);
  // The values that a dispatch with `override_values` records, by core::ResolvePushConstants (an
  // override stays with the algorithm). On error nothing changes.
  absl::StatusOr<std::vector<uint8_t>> ResolvePushConstants(
      const std::optional<std::vector<uint8_t>>& override_values);

 private:
  std::shared_ptr<Connection> connection_;
  const uint64_t handle_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RemoteTensor>> tensors_;  // guarded by mu_
  std::vector<uint8_t> push_;                           // guarded by mu_
  bool created_ = false;                                // guarded by mu_
};

// The remote objects behind backend objects, which must be `owner`'s: INVALID_ARGUMENT for a null
// one, FAILED_PRECONDITION for another backend's.
absl::StatusOr<std::vector<std::shared_ptr<RemoteTensor>>> Unwrap(
    const void* owner, const std::vector<std::shared_ptr<BackendTensor>>& tensors);
absl::StatusOr<std::shared_ptr<RemoteAlgorithm>> Unwrap(
    const void* owner, const std::shared_ptr<BackendAlgorithm>& algorithm);

}  // namespace kp::internal::remote
