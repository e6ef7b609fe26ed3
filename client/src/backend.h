#pragma once
// The interface between the kp facade and what runs the work: in-process over core, or remote
// over gRPC. Every method is thread-safe. Errors are statuses; the facade turns them into
// kp::Error.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/tensor.h"

namespace kp::internal {

// Objects made by one backend carry it as their owner; a backend refuses objects of another.
class BackendObject {
 public:
  explicit BackendObject(const void* owner) : owner_(owner) {}
  virtual ~BackendObject() = default;
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
};

struct TensorSpec {
  komputed::core::ElementType type = komputed::core::ElementType::kFloat32;
  uint64_t count = 0;
  uint32_t element_size = 0;
  komputed::core::MemoryType memory = komputed::core::MemoryType::kDevice;
};

class BackendTensor : public BackendObject {
 public:
  using BackendObject::BackendObject;
  // The host copy, stable for the tensor's life; nullptr for storage tensors.
  virtual void* host_data() = 0;
};

class BackendAlgorithm : public BackendObject {
 public:
  using BackendObject::BackendObject;
};

struct AlgorithmSpec {
  std::vector<std::shared_ptr<BackendTensor>> tensors;
  std::vector<uint32_t> spirv;
  komputed::core::Workgroup workgroup;
  std::vector<uint8_t> spec_constants;
  uint32_t spec_constant_size = 4;
  std::vector<uint8_t> push_constants;
};

// One recorded operation (OpMult arrives as kDispatch of its filled-in algorithm).
struct Op {
  enum class Kind { kSyncDevice, kSyncLocal, kCopy, kDispatch, kBarrier };
  Kind kind = Kind::kSyncDevice;
  std::vector<std::shared_ptr<BackendTensor>> tensors;
  std::shared_ptr<BackendAlgorithm> algorithm;
  std::optional<std::vector<uint8_t>> push_constants;  // a dispatch's override
  uint32_t src_access = 0, dst_access = 0, src_stage = 0, dst_stage = 0;
  bool primary = true;
};

class BackendSequence : public BackendObject {
 public:
  using BackendObject::BackendObject;
  virtual absl::Status Record(const Op& op) = 0;
  virtual absl::Status Submit() = 0;
  // DEADLINE_EXCEEDED: still running after `timeout`.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Submit and Wait; a backend may do both in one step.
  virtual absl::Status Eval(absl::Duration timeout) {
    absl::Status s = Submit();
    return s.ok() ? Wait(timeout) : s;
  }
  virtual absl::Status Clear() = 0;
  virtual absl::Status Rerecord() = 0;
  virtual bool IsRunning() const = 0;
  virtual bool IsRecording() const = 0;
  virtual std::vector<uint64_t> Timestamps() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // `data` (nullable) holds count * element_size bytes.
  virtual absl::StatusOr<std::shared_ptr<BackendTensor>> CreateTensor(const TensorSpec& spec,
                                                                      const void* data) = 0;
  virtual absl::StatusOr<std::shared_ptr<BackendAlgorithm>> CreateAlgorithm(
      const AlgorithmSpec& spec) = 0;
  // On error the algorithm is unchanged.
  virtual absl::Status RebuildAlgorithm(BackendAlgorithm& algorithm, const AlgorithmSpec& spec) = 0;
  virtual absl::Status SetPushConstants(BackendAlgorithm& algorithm,
                                        std::vector<uint8_t> values) = 0;
  virtual absl::StatusOr<std::shared_ptr<BackendSequence>> CreateSequence(
      uint32_t queue, uint32_t total_timestamps) = 0;
  virtual VkPhysicalDeviceProperties Properties() const = 0;
  virtual absl::StatusOr<std::vector<VkPhysicalDeviceProperties>> ListDevices() const = 0;
};

// The backend over core on a local device.
absl::StatusOr<std::shared_ptr<Backend>> CreateInProcessBackend(
    const komputed::core::DeviceOptions& options);

}  // namespace kp::internal
