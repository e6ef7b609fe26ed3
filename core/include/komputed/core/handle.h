#pragma once

#include <vulkan/vulkan_core.h>

#include <utility>

namespace komputed::core {

// Owns one Vulkan object created from a VkDevice and destroys it exactly once: in the destructor,
// or in Reset(). Move-only. Wrap a handle on the line after the vkCreate* call that made it, so
// that no early return can leak it.
template <typename H, void (*kDestroy)(VkDevice, H, const VkAllocationCallbacks*)>
class DeviceHandle {
 public:
  DeviceHandle() = default;
  DeviceHandle(VkDevice device, H handle) : device_(device), handle_(handle) {}
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  DeviceHandle(DeviceHandle&& other) noexcept
      : device_(other.device_), handle_(std::exchange(other.handle_, VK_NULL_HANDLE)) {}
  DeviceHandle& operator=(DeviceHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      device_ = other.device_;
      handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
    }
    return *this;
  }
  ~DeviceHandle() { Reset(); }

  void Reset() {
    if (handle_ != VK_NULL_HANDLE)
      kDestroy(device_, std::exchange(handle_, VK_NULL_HANDLE), nullptr);
  }
  H get() const { return handle_; }
  explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

 private:
  VkDevice device_ = VK_NULL_HANDLE;
  H handle_ = VK_NULL_HANDLE;
};

// One alias per kind of Vulkan object that core creates.
using BufferHandle = DeviceHandle<VkBuffer, vkDestroyBuffer>;
using MemoryHandle = DeviceHandle<VkDeviceMemory, vkFreeMemory>;
using ShaderModuleHandle = DeviceHandle<VkShaderModule, vkDestroyShaderModule>;
using DescriptorSetLayoutHandle = DeviceHandle<VkDescriptorSetLayout, vkDestroyDescriptorSetLayout>;
using DescriptorPoolHandle = DeviceHandle<VkDescriptorPool, vkDestroyDescriptorPool>;
using PipelineLayoutHandle = DeviceHandle<VkPipelineLayout, vkDestroyPipelineLayout>;
using PipelineHandle = DeviceHandle<VkPipeline, vkDestroyPipeline>;
using CommandPoolHandle = DeviceHandle<VkCommandPool, vkDestroyCommandPool>;
using FenceHandle = DeviceHandle<VkFence, vkDestroyFence>;
using QueryPoolHandle = DeviceHandle<VkQueryPool, vkDestroyQueryPool>;
using SemaphoreHandle = DeviceHandle<VkSemaphore, vkDestroySemaphore>;
using ImageHandle = DeviceHandle<VkImage, vkDestroyImage>;
using ImageViewHandle = DeviceHandle<VkImageView, vkDestroyImageView>;

}  // namespace komputed::core
