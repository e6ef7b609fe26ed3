#pragma once

#include <vulkan/vulkan_core.h>

#include <array>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace komputed::core {

// The Vulkan entry points whose failure does not depend on the program: memory allocation,
// queue submission and fence waits. core calls them through this interface so that tests can make
// them fail on demand (FaultInjectingCalls). Implementations must be thread-safe.
class VulkanCalls {
 public:
  virtual ~VulkanCalls() = default;

  virtual VkResult AllocateMemory(VkDevice device, const VkMemoryAllocateInfo* info,
                                  VkDeviceMemory* memory);
  virtual VkResult QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo* submits,
                               VkFence fence);
  virtual VkResult WaitForFences(VkDevice device, uint32_t count, const VkFence* fences,
                                 VkBool32 wait_all, uint64_t timeout_ns);
  // A submission's wait through its timeline semaphore (one that shared its vkQueueSubmit).
  virtual VkResult WaitSemaphores(VkDevice device, const VkSemaphoreWaitInfo* info,
                                  uint64_t timeout_ns);

  // The real Vulkan calls. Lives forever.
  static std::shared_ptr<VulkanCalls> Default();
};

// kWaitForFences: a wait for a submission, on its fence or (WaitSemaphores) its timeline
// semaphore.
enum class VulkanCall { kAllocateMemory = 0, kQueueSubmit = 1, kWaitForFences = 2 };

// Passes calls to `base` until told to fail: FailNext(call, result, n) makes the next n calls of
// that kind return `result` without reaching the driver.
class FaultInjectingCalls : public VulkanCalls {
 public:
  explicit FaultInjectingCalls(std::shared_ptr<VulkanCalls> base = VulkanCalls::Default())
      : base_(std::move(base)) {}

  void FailNext(VulkanCall call, VkResult result, int times = 1);
  // How many calls of that kind were made, failed ones included.
  int Count(VulkanCall call) const;

  VkResult AllocateMemory(VkDevice device, const VkMemoryAllocateInfo* info,
                          VkDeviceMemory* memory) override;
  VkResult QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo* submits,
                       VkFence fence) override;
  VkResult WaitForFences(VkDevice device, uint32_t count, const VkFence* fences, VkBool32 wait_all,
                         uint64_t timeout_ns) override;
  VkResult WaitSemaphores(VkDevice device, const VkSemaphoreWaitInfo* info,
                          uint64_t timeout_ns) override;

 private:
  struct Plan {
    VkResult result = VK_SUCCESS;
    int remaining = 0;
    int calls = 0;
  };
  // Counts the call; returns the injected failure or VK_SUCCESS.
  VkResult Take(VulkanCall call);

  std::shared_ptr<VulkanCalls> base_;
  mutable absl::Mutex mu_;
  std::array<Plan, 3> plans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::core
