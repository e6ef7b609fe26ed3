#include "komputed/core/vulkan_calls.h"

namespace komputed::core {

VkResult VulkanCalls::AllocateMemory(VkDevice device, const VkMemoryAllocateInfo* info,
                                     VkDeviceMemory* memory) {
  return vkAllocateMemory(device, info, nullptr, memory);
}

VkResult VulkanCalls::QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo* submits,
                                  VkFence fence) {
  return vkQueueSubmit(queue, count, submits, fence);
}

VkResult VulkanCalls::WaitForFences(VkDevice device, uint32_t count, const VkFence* fences,
                                    VkBool32 wait_all, uint64_t timeout_ns) {
  return vkWaitForFences(device, count, fences, wait_all, timeout_ns);
}

VkResult VulkanCalls::WaitSemaphores(VkDevice device, const VkSemaphoreWaitInfo* info,
                                     uint64_t timeout_ns) {
  return vkWaitSemaphores(device, info, timeout_ns);
}

std::shared_ptr<VulkanCalls> VulkanCalls::Default() {
  static const auto* calls = new std::shared_ptr<VulkanCalls>(std::make_shared<VulkanCalls>());
  return *calls;
}

void FaultInjectingCalls::FailNext(VulkanCall call, VkResult result, int times) {
  absl::MutexLock lock(&mu_);
  Plan& plan = plans_[static_cast<int>(call)];
  plan.result = result;
  plan.remaining = times;
}

int FaultInjectingCalls::Count(VulkanCall call) const {
  absl::MutexLock lock(&mu_);
  return plans_[static_cast<int>(call)].calls;
}

VkResult FaultInjectingCalls::Take(VulkanCall call) {
  absl::MutexLock lock(&mu_);
  Plan& plan = plans_[static_cast<int>(call)];
  ++plan.calls;
  if (plan.remaining <= 0) return VK_SUCCESS;
  --plan.remaining;
  return plan.result;
}

VkResult FaultInjectingCalls::AllocateMemory(VkDevice device, const VkMemoryAllocateInfo* info,
                                             VkDeviceMemory* memory) {
  VkResult injected = Take(VulkanCall::kAllocateMemory);
  return injected != VK_SUCCESS ? injected : base_->AllocateMemory(device, info, memory);
}

VkResult FaultInjectingCalls::QueueSubmit(VkQueue queue, uint32_t count,
                                          const VkSubmitInfo* submits, VkFence fence) {
  VkResult injected = Take(VulkanCall::kQueueSubmit);
  return injected != VK_SUCCESS ? injected : base_->QueueSubmit(queue, count, submits, fence);
}

VkResult FaultInjectingCalls::WaitForFences(VkDevice device, uint32_t count, const VkFence* fences,
                                            VkBool32 wait_all, uint64_t timeout_ns) {
  VkResult injected = Take(VulkanCall::kWaitForFences);
  return injected != VK_SUCCESS ? injected
                                : base_->WaitForFences(device, count, fences, wait_all, timeout_ns);
}

VkResult FaultInjectingCalls::WaitSemaphores(VkDevice device, const VkSemaphoreWaitInfo* info,
                                             uint64_t timeout_ns) {
  VkResult injected = Take(VulkanCall::kWaitForFences);
  return injected != VK_SUCCESS ? injected : base_->WaitSemaphores(device, info, timeout_ns);
}

}  // namespace komputed::core
