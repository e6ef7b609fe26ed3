#include "remote/objects.h"

#include <utility>

namespace kp::internal::remote {

namespace core = komputed::core;
namespace v1 = komputed::v1;

RemoteTensor::RemoteTensor(const void* owner, std::shared_ptr<Connection> connection,
                           uint64_t handle, const TensorSpec& spec,
                           std::shared_ptr<core::SharedMemory> shared)
    : BackendTensor(owner),
      connection_(std::move(connection)),
      handle_(handle),
      spec_(spec),
      shared_(std::move(shared)) {
  if (shared_ != nullptr) {
    host_ = static_cast<uint8_t*>(shared_->data());
  } else if (core::HasHostData(spec.memory)) {
    owned_.reset(new uint8_t[bytes()]);
    host_ = owned_.get();
  }
}

RemoteTensor::~RemoteTensor() {
  v1::Command c;
  c.mutable_destroy_tensor()->set_handle(handle_);
  connection_->Defer(std::move(c));
}

core::TensorFacts RemoteTensor::facts() const {
  return {this, spec_.type, spec_.element_size, spec_.count, spec_.memory, spec_.image};
}

RemoteAlgorithm::RemoteAlgorithm(const void* owner, std::shared_ptr<Connection> connection,
                                 uint64_t handle)
    : BackendAlgorithm(owner), connection_(std::move(connection)), handle_(handle) {}

RemoteAlgorithm::~RemoteAlgorithm() {
  if (!created_) return;  // its creation failed: the daemon never had it
  v1::Command c;
  c.mutable_destroy_algorithm()->set_handle(handle_);
  connection_->Defer(std::move(c));
}

std::vector<std::shared_ptr<RemoteTensor>> RemoteAlgorithm::tensors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_;
}

void RemoteAlgorithm::Built(std::vector<std::shared_ptr<RemoteTensor>> tensors,
                            std::vector<uint8_t> push) {
  std::lock_guard<std::mutex> lock(mu_);
  created_ = true;
  tensors_ = std::move(tensors);
  push_ = std::move(push);
}

std::vector<uint8_t> RemoteAlgorithm::PushConstants() const {
  std::lock_guard<std::mutex> lock(mu_);
  return push_;
}

void RemoteAlgorithm::SetPushConstants(std::vector<uint8_t> push) {
  std::lock_guard<std::mutex> lock(mu_);
  push_ = std::move(push);
}

absl::StatusOr<std::vector<uint8_t>> RemoteAlgorithm::ResolvePushConstants(
    const std::optional<std::vector<uint8_t>>& override_values) {
  std::lock_guard<std::mutex> lock(mu_);
  return core::ResolvePushConstants(override_values, push_);
}

absl::StatusOr<std::vector<std::shared_ptr<RemoteTensor>>> Unwrap(
    const void* owner, const std::vector<std::shared_ptr<BackendTensor>>& tensors) {
  std::vector<std::shared_ptr<RemoteTensor>> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t == nullptr) return absl::InvalidArgumentError("a tensor is null or destroyed");
    if (t->owner() != owner) {
      return absl::FailedPreconditionError("the tensor belongs to another Manager");
    }
    out.push_back(std::static_pointer_cast<RemoteTensor>(t));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<RemoteAlgorithm>> Unwrap(
    const void* owner, const std::shared_ptr<BackendAlgorithm>& algorithm) {
  if (algorithm == nullptr) return absl::InvalidArgumentError("the algorithm is not initialised");
  if (algorithm->owner() != owner) {
    return absl::FailedPreconditionError("the algorithm belongs to another Manager");
  }
  return std::static_pointer_cast<RemoteAlgorithm>(algorithm);
}

}  // namespace kp::internal::remote
