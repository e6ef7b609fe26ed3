#pragma once

#include <vulkan/vulkan_core.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "komputed/core/handle.h"
#include "komputed/core/vulkan_calls.h"

namespace komputed::core {

// Validation errors reported by VK_LAYER_KHRONOS_validation in this process so far.
uint64_t ValidationErrorCount();

// What a physical device is, as reported by the driver.
struct PhysicalDeviceInfo {
  uint32_t index = 0;  // position in vkEnumeratePhysicalDevices order
  VkPhysicalDeviceProperties properties{};
  VkPhysicalDeviceMemoryProperties memory{};
  std::vector<VkQueueFamilyProperties> queue_families;
  uint64_t max_buffer_size = 0;  // maintenance4's limit, or 0 when the device does not report it

  bool HasCompute(uint32_t family) const {
    return family < queue_families.size() &&
           (queue_families[family].queueFlags & VK_QUEUE_COMPUTE_BIT) != 0;
  }
  // A compute family without graphics: on NVIDIA GPUs the queues where a kernel leaves the
  // compute units it does not hold to other queues' work (one on a graphics family's queue kept
  // every other queue's work waiting, measured on the H200).
  bool HasComputeOnly(uint32_t family) const {
    return HasCompute(family) && (queue_families[family].queueFlags & VK_QUEUE_GRAPHICS_BIT) == 0;
  }
  // The first compute family, which Device::Create takes when DeviceOptions names none (none:
  // the device has no compute queue).
  std::optional<uint32_t> FirstComputeFamily() const {
    for (uint32_t f = 0; f < queue_families.size(); ++f) {
      if (HasCompute(f)) return f;
    }
    return std::nullopt;
  }
  // Total size of the device-local heaps.
  uint64_t DeviceLocalBytes() const;
  // Every queue of every compute-capable family, as DeviceOptions::queue_families lists them (a
  // family's index once per queue, families in order).
  std::vector<uint32_t> EveryComputeQueue() const;
};

// A Vulkan instance, shared by every Device made from it. Thread-safe.
class Instance {
 public:
  // validation: enable VK_LAYER_KHRONOS_validation (an error when it is not installed), with its
  // synchronization validation where the layer has VK_EXT_validation_features.
  static absl::StatusOr<std::shared_ptr<Instance>> Create(bool validation);
  // The instance of this process: validation is on when the environment variable
  // KOMPUTED_VALIDATION is set to 1. Created on first use, lives until exit.
  static absl::StatusOr<std::shared_ptr<Instance>> Shared();

  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  VkInstance handle() const { return instance_; }
  bool validation() const { return validation_; }
  const std::vector<VkPhysicalDevice>& physical_devices() const { return physical_devices_; }
  std::vector<PhysicalDeviceInfo> Describe() const;
  PhysicalDeviceInfo Describe(uint32_t index) const;

 private:
  Instance(VkInstance instance, bool validation, VkDebugUtilsMessengerEXT messenger);

  VkInstance instance_;
  bool validation_;
  VkDebugUtilsMessengerEXT messenger_;
  std::vector<VkPhysicalDevice> physical_devices_;
};

// What shaders may use on a device: the features that Device::Create enabled on it (each where
// the device has it: Vulkan 1.2's feature structs, on a Vulkan 1.1 device 16-bit storage and the
// extensions VK_KHR_8bit_storage and VK_KHR_shader_float16_int8; a Vulkan 1.0 device gets the 1.0
// features only).
struct ShaderFeatures {
  bool float64 = false;                             // shaderFloat64
  bool float16 = false;                             // shaderFloat16
  bool int64 = false;                               // shaderInt64
  bool int16 = false;                               // shaderInt16
  bool int8 = false;                                // shaderInt8
  bool storage_buffer_8bit = false;                 // storageBuffer8BitAccess
  bool storage_buffer_16bit = false;                // storageBuffer16BitAccess
  bool uniform_and_storage_buffer_8bit = false;     // uniformAndStorageBuffer8BitAccess
  bool uniform_and_storage_buffer_16bit = false;    // uniformAndStorageBuffer16BitAccess
  bool push_constant_8bit = false;                  // storagePushConstant8
  bool push_constant_16bit = false;                 // storagePushConstant16
  bool storage_image_extended_formats = false;      // shaderStorageImageExtendedFormats
  bool storage_image_read_without_format = false;   // shaderStorageImageReadWithoutFormat
  bool storage_image_write_without_format = false;  // shaderStorageImageWriteWithoutFormat
  // The subgroup operations (VkSubgroupFeatureFlags) of compute shaders; 0 when the device has
  // none in the compute stage.
  uint32_t subgroup_operations = 0;
};

// How to open a device.
struct DeviceOptions {
  // Index into the physical device list. Unset: the first discrete GPU, then integrated, virtual,
  // CPU, in that order.
  std::optional<uint32_t> physical_device_index;
  // One entry per queue: the family it comes from. Repeated entries of a family take its queues
  // 0, 1, 2... Empty: one queue of the first compute-capable family.
  std::vector<uint32_t> queue_families;
  // Device extensions to enable; those the device lacks are skipped and listed in
  // Device::skipped_extensions().
  std::vector<std::string> extensions;
  // Instance to use; unset: Instance::Shared().
  std::shared_ptr<Instance> instance;
  // The calls that can fail; unset: VulkanCalls::Default().
  std::shared_ptr<VulkanCalls> calls;
  // Map device-local memory that the host can also see (all memory on a CPU device); false makes
  // buffers behave as on a GPU whose device memory the host cannot reach (tests of those paths).
  bool map_device_memory = true;
  // Shader features to leave disabled even where the device has them (each one set here, and the
  // subgroup operations whose bits are set), so that shaders are checked as on a device without
  // them.
  ShaderFeatures withheld_features;
  // The Vulkan version whose way of finding and enabling the 8/16-bit features and timeline
  // semaphores is taken, when below the device's own: VK_API_VERSION_1_1 opens a newer device
  // as a Vulkan 1.1 one (16-bit storage as 1.1 has it, VK_KHR_8bit_storage and
  // VK_KHR_shader_float16_int8, no timeline semaphores), so that the path is tested. Unset: the
  // device's version.
  std::optional<uint32_t> feature_api_version;
  // The share of the device's invocation slots (resident_invocations()) that one dispatch may
  // hold at a time; a dispatch of more workgroups is run as a loop over fewer
  // (LoopOverWorkgroups in workgroup_loop.h), so that a dispatch that never ends leaves the rest
  // to other queues' work. 1 or more: no bound. Applies where the device reports its compute
  // units (resident_invocations() > 0).
  double dispatch_share = 1.0;
  // The invocation slots to assume instead of what the device reports (resident_invocations()):
  // for a device that reports none, or tests. 0: what it reports.
  uint64_t invocation_slots = 0;
};

// One queue of a device. Submissions to it are serialised by its mutex.
struct Queue {
  VkQueue handle = VK_NULL_HANDLE;
  uint32_t family = 0;
  uint32_t index = 0;  // within the family
  uint32_t timestamp_valid_bits = 0;
  absl::Mutex mu;
  uint64_t submissions ABSL_GUARDED_BY(mu) = 0;  // made so far: the order of their completion
};

// A logical device with its queues. Owns the VkDevice; every object made on it holds a
// shared_ptr to it, so it is destroyed after them. Thread-safe.
class Device {
 public:
  static absl::StatusOr<std::shared_ptr<Device>> Create(const DeviceOptions& options);
  // Every physical device of the shared instance.
  static absl::StatusOr<std::vector<PhysicalDeviceInfo>> List();

  // Waits for the device to be idle (Vulkan requires it before destroying the device; the one
  // wait without a bound, at the end of the device's life), then destroys it.
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice handle() const { return device_; }
  VkPhysicalDevice physical_device() const { return physical_device_; }
  const PhysicalDeviceInfo& info() const { return info_; }
  const VkPhysicalDeviceProperties& properties() const { return info_.properties; }
  const VkPhysicalDeviceLimits& limits() const { return info_.properties.limits; }
  const std::vector<std::string>& enabled_extensions() const { return enabled_extensions_; }
  const std::vector<std::string>& skipped_extensions() const { return skipped_extensions_; }
  bool float64_supported() const { return features_.float64; }
  const ShaderFeatures& shader_features() const { return features_; }
  // robustBufferAccess is enabled: out-of-bounds buffer accesses cannot reach other memory.
  bool robust_buffer_access() const { return robust_buffer_access_; }
  // robustImageAccess (Vulkan 1.3, VK_EXT_image_robustness) is enabled: out-of-bounds image
  // loads read zeros and stores are dropped. Shaders bind images only where it is.
  bool robust_image_access() const { return robust_image_access_; }
  // DeviceOptions::map_device_memory.
  bool maps_device_memory() const { return map_device_memory_; }
  // Timeline semaphores (Vulkan 1.2) are enabled: submissions can be awaited several at a time.
  bool timeline_supported() const { return timeline_; }
  VulkanCalls& calls() const { return *calls_; }
  // The alignment of host memory that buffers can be made over (Buffer::Import), from
  // VK_EXT_external_memory_host's minImportedHostPointerAlignment; 0 where the device cannot.
  uint64_t host_import_alignment() const { return host_import_alignment_; }
  // vkGetMemoryHostPointerPropertiesEXT (set where host_import_alignment() is not 0).
  PFN_vkGetMemoryHostPointerPropertiesEXT host_pointer_properties() const {
    return get_host_pointer_properties_;
  }
  // How many invocations the device runs at once when every compute unit is full, from what it
  // reports of them (VK_NV_shader_sm_builtins: SMs x warps per SM x warp size;
  // VK_AMD_shader_core_properties: compute units x SIMDs x wavefronts x wavefront size); 0 where
  // it does not report them (lavapipe). DeviceOptions::invocation_slots replaces it.
  uint64_t resident_invocations() const { return resident_invocations_; }
  uint32_t subgroup_size() const { return subgroup_size_; }
  double dispatch_share() const { return dispatch_share_; }
  // The most workgroups of `local_invocations` invocations that one dispatch may keep on the
  // device at once (DeviceOptions::dispatch_share of its invocation slots, whole subgroups per
  // workgroup and at least two, at least 1); 0 for no bound.
  uint32_t ResidentWorkgroupLimit(uint64_t local_invocations) const {
    return ResidentWorkgroupLimit(local_invocations, dispatch_share_);
  }
  // The same for another share (1 or more: no bound).
  uint32_t ResidentWorkgroupLimit(uint64_t local_invocations, double share) const;

  size_t queue_count() const { return queues_.size(); }
  Queue& queue(size_t i) const { return *queues_[i]; }

  // A memory type among `type_bits` with all of `required`, preferring one that also has
  // `preferred`. NOT_FOUND when there is none.
  absl::StatusOr<uint32_t> FindMemoryType(uint32_t type_bits, VkMemoryPropertyFlags required,
                                          VkMemoryPropertyFlags preferred = 0) const;
  uint64_t HeapSize(uint32_t memory_type) const;

  // One submission of a vkQueueSubmit: `command_buffer`, after `prologue` when that is given;
  // when `timeline` is given, it signals that semaphore to `timeline_value` on completion.
  struct SubmitItem {
    VkCommandBuffer command_buffer = VK_NULL_HANDLE;
    VkCommandBuffer prologue = VK_NULL_HANDLE;
    VkSemaphore timeline = VK_NULL_HANDLE;
    uint64_t timeline_value = 0;
  };
  // Submits one command buffer to queue `queue` with `fence` (SubmitBatch of one item).
  absl::Status Submit(size_t queue, VkCommandBuffer command_buffer, VkFence fence,
                      VkSemaphore timeline = VK_NULL_HANDLE, uint64_t timeline_value = 0,
                      VkCommandBuffer prologue = VK_NULL_HANDLE, uint64_t* order = nullptr);
  // Submits `items` (at least one) to queue `queue` in one vkQueueSubmit, in their order, with
  // `fence` (which signals once all of them have completed). `first_order`, when given, receives
  // the first item's place on its queue; the others take the places after it (1, 2, ...): a
  // queue's submissions complete in that order.
  absl::Status SubmitBatch(size_t queue, absl::Span<const SubmitItem> items, VkFence fence,
                           uint64_t* first_order = nullptr);
  // Waits for `fence`; DEADLINE_EXCEEDED after `timeout`.
  absl::Status Wait(VkFence fence, absl::Duration timeout);
  // Waits until the timeline semaphore `timeline` has reached `value`; DEADLINE_EXCEEDED after
  // `timeout`.
  absl::Status WaitTimeline(VkSemaphore timeline, uint64_t value, absl::Duration timeout);
  // Records commands with `record`, runs them on queue 0 and waits (bounded by `timeout`). For
  // one-off work such as filling new buffers.
  absl::Status RunOnce(const std::function<void(VkCommandBuffer)>& record,
                       absl::Duration timeout = absl::Minutes(1));

  // Objects that users of the device share while any of them holds one (algorithms with the same
  // code, specialisation and layout share their compute pipeline, across sessions too), found by
  // a key that names everything they are made from. Shared() returns the live object of `key`,
  // else null; Share() files `object` under `key` and returns the object that is filed there
  // (another caller's, when one was filed first), so that racing makers agree on one.
  std::shared_ptr<const void> Shared(const std::string& key) const;
  std::shared_ptr<const void> Share(const std::string& key, std::shared_ptr<const void> object);
  // Keys with a live object (for tests).
  size_t shared_count() const;

  // Once a call has reported VK_ERROR_DEVICE_LOST every later submission fails with UNAVAILABLE.
  bool lost() const { return lost_.load(); }
  // Declares the device lost without the driver saying so: for a device that stopped answering
  // (a stopped submission that never completes). New submissions fail as after
  // VK_ERROR_DEVICE_LOST; those in flight keep their resources until they complete or their
  // waits time out; destruction does not wait for the device to be idle (it could wait for ever).
  void MarkLost(absl::string_view why);
  // Turns a failed result into a status, remembering device loss.
  absl::Status Check(VkResult result, absl::string_view what);
  // `size` bytes of memory type `type` (vkAllocateMemory through calls()); errors as Check's,
  // naming the size and `what` the memory is for.
  absl::StatusOr<MemoryHandle> AllocateMemory(uint64_t size, uint32_t type, absl::string_view what);

 private:
  Device() = default;

  std::shared_ptr<Instance> instance_;
  std::shared_ptr<VulkanCalls> calls_;
  VkPhysicalDevice physical_device_ = VK_NULL_HANDLE;
  PhysicalDeviceInfo info_;
  VkDevice device_ = VK_NULL_HANDLE;
  std::vector<std::unique_ptr<Queue>> queues_;
  std::vector<std::string> enabled_extensions_;
  std::vector<std::string> skipped_extensions_;
  ShaderFeatures features_;
  bool robust_buffer_access_ = false;
  bool robust_image_access_ = false;
  bool map_device_memory_ = true;
  bool timeline_ = false;
  uint64_t resident_invocations_ = 0;
  uint32_t subgroup_size_ = 0;
  uint64_t host_import_alignment_ = 0;
  PFN_vkGetMemoryHostPointerPropertiesEXT get_host_pointer_properties_ = nullptr;
  double dispatch_share_ = 1.0;
  std::atomic<bool> lost_{false};
  std::atomic<bool> unresponsive_{false};  // MarkLost: never wait for idle

  mutable absl::Mutex shared_mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<const void>> shared_ ABSL_GUARDED_BY(shared_mu_);
  size_t shared_sweep_at_ ABSL_GUARDED_BY(shared_mu_) = 64;  // map size that triggers a sweep

  absl::Mutex once_mu_;  // guards the RunOnce pool and fence
  CommandPoolHandle once_pool_ ABSL_GUARDED_BY(once_mu_);
  FenceHandle once_fence_ ABSL_GUARDED_BY(once_mu_);
};

}  // namespace komputed::core
