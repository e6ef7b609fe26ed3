#pragma once
// The interface between the kp facade and what runs the work: in-process over core, or remote
// over gRPC. Every method is thread-safe. Errors are statuses; the facade turns them into
// kp::Error.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/tensor.h"

namespace kp::internal {

// How long a wait for the device (its fence in-process, the daemon's answer on the same-host
// channel) polls before it sleeps, at least: $KOMPUTED_FENCE_SPIN_US microseconds, else 50 on a
// GPU (a sleeping wait wakes tens of microseconds late) and none on a CPU device (whose work would
// compete with the polling for the same cores).
absl::Duration WaitSpin(VkPhysicalDeviceType type);
// How long after its submission a wait polls at most, for submissions that have been taking about
// that long (core::SpinWindow): $KOMPUTED_FENCE_SPIN_MAX_US microseconds, else 10 times `base`.
absl::Duration WaitSpinLimit(absl::Duration base);

// Objects made by one backend carry it as their owner; a backend refuses objects of another.
// Destructors only release: no network call, no wait for the daemon (a remote object's destroy
// goes with the backend's next call to the daemon, or is freed with its session).
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
  // Set: a 2-D image (count is then its element count).
  komputed::core::ImageShape image;
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
  // The push constants that a dispatch recorded now without an override would use.
  virtual std::vector<uint8_t> PushConstants() const = 0;
};

struct AlgorithmSpec {
  std::vector<std::shared_ptr<BackendTensor>> tensors;
  std::vector<uint32_t> spirv;
  komputed::core::Workgroup workgroup;
  std::vector<uint8_t> spec_constants;
  uint32_t spec_constant_size = 4;
  std::vector<uint8_t> push_constants;
};

// One recorded operation, in backend objects (OpMult arrives as kDispatch of its filled-in
// algorithm). Its meaning and rules are core's (komputed/core/op_semantics.h).
using Op =
    komputed::core::OpDesc<std::shared_ptr<BackendTensor>, std::shared_ptr<BackendAlgorithm>>;

// Destroying a sequence whose submission is in flight does not wait for it there (in-process,
// core waits for the device, bounded); its results are dropped. Wait first to have them.
class BackendSequence : public BackendObject {
 public:
  using BackendObject::BackendObject;
  // Validates the operation by core's rules (ValidateOpTensors, the push-constant size); on error
  // nothing of it is recorded or applied.
  virtual absl::Status Record(const Op& op) = 0;
  virtual absl::Status Submit() = 0;
  // DEADLINE_EXCEEDED: still running after `timeout`.
  virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Submit and Wait; a backend may do both in one step.
  virtual absl::Status Eval(absl::Duration timeout) {
    absl::Status s = Submit();
    return s.ok() ? Wait(timeout) : s;
  }
  // Ends the recording; what was recorded stays and runs at the next submission.
  // FAILED_PRECONDITION while running.
  virtual absl::Status End() = 0;
  // Drops the recorded ops and their host steps (as Kompute 0.9, what was recorded still runs at
  // the next submission, without host steps, until the next Record). FAILED_PRECONDITION while
  // running.
  virtual absl::Status Clear() = 0;
  virtual absl::Status Rerecord() = 0;
  virtual bool IsRunning() const = 0;
  virtual bool IsRecording() const = 0;
  virtual std::vector<uint64_t> Timestamps() const = 0;
};

// A device as Backend::ListDevices lists it: its properties, and its handle in this process's
// Vulkan instance (VK_NULL_HANDLE for a device that is not in this process).
struct DeviceEntry {
  VkPhysicalDeviceProperties properties;
  VkPhysicalDevice handle = VK_NULL_HANDLE;
};

class Backend {
 public:
  // Releases without I/O: a backend that was not closed leaves its remote session to the
  // daemon's idle reaper.
  virtual ~Backend() = default;
  // Ends the backend's use of its device within `timeout` (a remote backend closes its session,
  // which frees everything that the daemon holds for it). Objects made here may outlive it,
  // unusable. Idempotent.
  virtual absl::Status Close(absl::Duration timeout) = 0;
  // `data` (nullable) holds count * element_size bytes.
  virtual absl::StatusOr<std::shared_ptr<BackendTensor>> CreateTensor(const TensorSpec& spec,
                                                                      const void* data) = 0;
  virtual absl::StatusOr<std::shared_ptr<BackendAlgorithm>> CreateAlgorithm(
      const AlgorithmSpec& spec) = 0;
  // On error the algorithm is unchanged.
  virtual absl::Status RebuildAlgorithm(BackendAlgorithm& algorithm, const AlgorithmSpec& spec) = 0;
  // INVALID_ARGUMENT unless `values` has the size that the algorithm was built with.
  virtual absl::Status SetPushConstants(BackendAlgorithm& algorithm,
                                        std::vector<uint8_t> values) = 0;
  virtual absl::StatusOr<std::shared_ptr<BackendSequence>> CreateSequence(
      uint32_t queue, uint32_t total_timestamps) = 0;
  virtual VkPhysicalDeviceProperties Properties() const = 0;
  virtual absl::StatusOr<std::vector<DeviceEntry>> ListDevices() const = 0;
};

// The backend over core on a local device.
absl::StatusOr<std::shared_ptr<Backend>> CreateInProcessBackend(
    const komputed::core::DeviceOptions& options);

}  // namespace kp::internal
