#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "komputed/core/cancel_check.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

// Number of workgroups dispatched in each dimension.
struct Workgroup {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

// Everything an algorithm is made from.
struct AlgorithmSpec {
  std::vector<std::shared_ptr<Tensor>> tensors;  // binding i of set 0 = tensors[i]
  std::vector<uint32_t> spirv;
  Workgroup workgroup;
  // Specialization constant i (constant_id = i) is at byte offset i * spec_constant_size.
  std::vector<uint8_t> spec_constants;
  uint32_t spec_constant_size = 4;
  // The push-constant values (a multiple of 4 bytes), set before each dispatch. The pipeline's
  // range covers them and the shader's push-constant block: bytes of the block beyond them read
  // as zero.
  std::vector<uint8_t> push_constants;
  // When set, the shader is rewritten with AddCancelChecks (cancel_check.h) and reads this word at
  // set 1, binding 0: setting it stops the algorithm's dispatches (the daemon's kernel watchdog).
  std::shared_ptr<CancelWord> cancel;
  // Whether the shader's buffer accesses are clamped into their buffers (ClampBufferAccesses)
  // before it reaches the driver. Only measurements turn it off: the daemon and the kp API
  // always clamp.
  bool clamp_buffer_accesses = true;
  // The most workgroups a dispatch keeps on the device at once: a dispatch of more runs as a loop
  // over this many (LoopOverWorkgroups). 0: the device's ResidentWorkgroupLimit for the shader's
  // local size (no bound where the device sets none, or on a CPU device).
  uint32_t resident_workgroups = 0;
  // Algorithms whose driver code, specialisation and layout are the same share one compute
  // pipeline (Device::Share) when they have the same scope: the daemon gives each tenant's
  // algorithms the tenant's name, so that no tenant learns from how fast a build went what
  // another one runs. In-process all share.
  std::string share_scope;
};

// A compute pipeline bound to its tensors (Kompute's Algorithm). Thread-safe.
class Algorithm {
 public:
  // Errors (INVALID_ARGUMENT unless noted): invalid SPIR-V (never reaches the driver), push
  // constants over the device limit or not a multiple of 4, spec constants not a whole number of
  // constants, a zero workgroup or one over maxComputeWorkGroupCount, a tensor over
  // maxStorageBufferRange, a tensor of another device (FAILED_PRECONDITION), and a shader that
  // does not fit the algorithm or the device (CheckShader in shader_intake.h: no GLCompute
  // "main", a capability or extension not allowed, a descriptor that is not one of the tensors,
  // a local size over the device's limits; shared memory or a push-constant block over them is
  // RESOURCE_EXHAUSTED). The shader's buffer accesses are clamped into the tensors' buffers.
  static absl::StatusOr<std::shared_ptr<Algorithm>> Create(std::shared_ptr<Device> device,
                                                           AlgorithmSpec spec);
  ~Algorithm();

  // Replaces everything; on error nothing changes. Sequences that recorded this algorithm must
  // re-record before their next submission.
  absl::Status Rebuild(AlgorithmSpec spec);
  // Replaces the push-constant values; INVALID_ARGUMENT unless the size is the same.
  absl::Status SetPushConstants(std::vector<uint8_t> values);

  AlgorithmSpec spec() const;
  // spec().tensors and spec().push_constants, without copying the rest (the SPIR-V words).
  std::vector<std::shared_ptr<Tensor>> tensors() const;
  std::vector<uint8_t> push_constants() const;
  const Device& device() const { return *device_; }
  // Bytes of push constants the algorithm takes.
  size_t push_constant_size() const;
  uint64_t generation() const;  // incremented by each Rebuild
  // The workgroups each dispatch actually launches: the spec's, or fewer that loop over them
  // (AlgorithmSpec::resident_workgroups).
  Workgroup dispatched() const;

  // Records bind + push constants + dispatch (the caller adds barriers). The returned token keeps
  // the pipeline (and its tensors) alive while the recording exists, across rebuilds;
  // `generation` says which build was recorded. The push constants are the algorithm's, or
  // `push_constants` when not null (recording again what was recorded before); `used` (when not
  // null) receives the values recorded.
  std::shared_ptr<const void> RecordDispatch(VkCommandBuffer cb, uint64_t* generation,
                                             const std::vector<uint8_t>* push_constants = nullptr,
                                             std::vector<uint8_t>* used = nullptr) const;

 private:
  struct Pipeline;
  explicit Algorithm(std::shared_ptr<Device> device);
  absl::StatusOr<std::shared_ptr<Pipeline>> Build(const AlgorithmSpec& spec) const;

  std::shared_ptr<Device> device_;
  mutable absl::Mutex mu_;
  AlgorithmSpec spec_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Pipeline> pipeline_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace komputed::core
