#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "komputed/core/device.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

// Where an instrumented shader reads its cancel word: descriptor set 1 (set 0 is the tensors'),
// binding 0.
inline constexpr uint32_t kCancelSet = 1;
inline constexpr uint32_t kCancelBinding = 0;

// Rewrites a compute module so that a running dispatch of it can be stopped: at the start of every
// GLCompute entry point and at every loop back-edge it reads the first 32-bit word of a storage
// buffer at descriptor set `set`, binding `binding`, with a relaxed atomic load (device scope: it
// always reaches the memory the host writes, where a Volatile load was served from a cache that
// never saw the host's write on NVIDIA, and it is never hoisted out of a loop); once that
// word is nonzero, entry points return at once and every loop exits at its next iteration. A
// dispatch then ends within one loop iteration per invocation still running, plus the time to
// start and return the invocations not yet begun.
//
// Takes a module that passed ValidateSpirv (Logical addressing). INVALID_ARGUMENT for a loop whose
// back edge it cannot check (a back-edge block that branches anywhere but to its loop's header
// and merge block); the result is what the caller should validate again.
absl::StatusOr<std::vector<uint32_t>> AddCancelChecks(absl::Span<const uint32_t> spirv,
                                                      uint32_t set = kCancelSet,
                                                      uint32_t binding = kCancelBinding);

// The word that AddCancelChecks' shaders read: a small host-visible, host-coherent storage buffer
// that the host sets while a dispatch runs. Thread-safe.
class CancelWord {
 public:
  static absl::StatusOr<std::shared_ptr<CancelWord>> Create(std::shared_ptr<Device> device);

  VkBuffer buffer() const { return buffer_.handle(); }
  // Stops every instrumented dispatch that reads this word, now and later.
  void Set();
  bool set() const;

 private:
  CancelWord() = default;
  std::shared_ptr<Device> device_;
  Buffer buffer_;  // destroyed before the device
};

}  // namespace komputed::core
