#include "komputed/core/device.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "komputed/core/status.h"

namespace komputed::core {
namespace {

constexpr char kValidationLayer[] = "VK_LAYER_KHRONOS_validation";

std::atomic<uint64_t> g_validation_errors{0};

// A wait's bound in nanoseconds, as the Vulkan waits take it (no bound for an infinite one).
uint64_t TimeoutNs(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return UINT64_MAX;
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout)));
}

VKAPI_ATTR VkBool32 VKAPI_CALL OnValidationMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                   VkDebugUtilsMessageTypeFlagsEXT,
                                                   const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                   void*) {
  if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
    g_validation_errors.fetch_add(1);
    spdlog::error("vulkan validation: {}", data->pMessage);
  } else {
    spdlog::warn("vulkan validation: {}", data->pMessage);
  }
  return VK_FALSE;
}

bool EnvFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

int TypeRank(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

bool HasExtension(const std::vector<VkExtensionProperties>& available, const char* name) {
  return std::any_of(available.begin(), available.end(), [&](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, name) == 0;
  });
}

// The 8- and 16-bit features and timeline semaphores that a physical device has: from Vulkan
// 1.2's feature structs; on a Vulkan 1.1 device from 16-bit storage (core there) and the
// extensions VK_KHR_8bit_storage and VK_KHR_shader_float16_int8 where it has them. A Vulkan 1.0
// device reports none of them here.
struct SupportedFeatures {
  bool float16 = false;
  bool int8 = false;
  bool storage_buffer_8bit = false;
  bool storage_buffer_16bit = false;
  bool uniform_and_storage_buffer_8bit = false;
  bool uniform_and_storage_buffer_16bit = false;
  bool push_constant_8bit = false;
  bool push_constant_16bit = false;
  bool timeline = false;
  // Enabled through Vulkan 1.2's structs; else through 1.1's and the extensions.
  bool core_1_2 = false;

  void Query(VkPhysicalDevice physical, uint32_t api_version,
             const std::vector<VkExtensionProperties>& available) {
    if (api_version >= VK_API_VERSION_1_2) {
      core_1_2 = true;
      VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
      VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
      VkPhysicalDeviceFeatures2 query{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
      query.pNext = &v11;
      v11.pNext = &v12;
      vkGetPhysicalDeviceFeatures2(physical, &query);
      storage_buffer_16bit = v11.storageBuffer16BitAccess == VK_TRUE;
      uniform_and_storage_buffer_16bit = v11.uniformAndStorageBuffer16BitAccess == VK_TRUE;
      push_constant_16bit = v11.storagePushConstant16 == VK_TRUE;
      storage_buffer_8bit = v12.storageBuffer8BitAccess == VK_TRUE;
      uniform_and_storage_buffer_8bit = v12.uniformAndStorageBuffer8BitAccess == VK_TRUE;
      push_constant_8bit = v12.storagePushConstant8 == VK_TRUE;
      float16 = v12.shaderFloat16 == VK_TRUE;
      int8 = v12.shaderInt8 == VK_TRUE;
      timeline = v12.timelineSemaphore == VK_TRUE;
      return;
    }
    if (api_version < VK_API_VERSION_1_1) return;
    VkPhysicalDevice16BitStorageFeatures s16{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDevice8BitStorageFeatures s8{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
    VkPhysicalDeviceShaderFloat16Int8Features f16i8{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    VkPhysicalDeviceFeatures2 query{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    query.pNext = &s16;
    void** next = &s16.pNext;
    if (HasExtension(available, VK_KHR_8BIT_STORAGE_EXTENSION_NAME)) {
      *next = &s8;
      next = &s8.pNext;
    }
    if (HasExtension(available, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME)) *next = &f16i8;
    vkGetPhysicalDeviceFeatures2(physical, &query);
    storage_buffer_16bit = s16.storageBuffer16BitAccess == VK_TRUE;
    uniform_and_storage_buffer_16bit = s16.uniformAndStorageBuffer16BitAccess == VK_TRUE;
    push_constant_16bit = s16.storagePushConstant16 == VK_TRUE;
    storage_buffer_8bit = s8.storageBuffer8BitAccess == VK_TRUE;
    uniform_and_storage_buffer_8bit = s8.uniformAndStorageBuffer8BitAccess == VK_TRUE;
    push_constant_8bit = s8.storagePushConstant8 == VK_TRUE;
    float16 = f16i8.shaderFloat16 == VK_TRUE;
    int8 = f16i8.shaderInt8 == VK_TRUE;
  }
};

// The structs that enable the features of `enabled` beyond Vulkan 1.0's, chained to a
// VkPhysicalDeviceFeatures2, and the extensions that they need. Lives until vkCreateDevice.
struct EnabledFeatures {
  VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDevice16BitStorageFeatures s16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  VkPhysicalDevice8BitStorageFeatures s8{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES};
  VkPhysicalDeviceShaderFloat16Int8Features f16i8{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  std::vector<const char*> extensions;

  void Chain(VkPhysicalDeviceFeatures2& features, const SupportedFeatures& supported,
             const ShaderFeatures& enabled) {
    if (supported.core_1_2) {
      v11.storageBuffer16BitAccess = enabled.storage_buffer_16bit;
      v11.uniformAndStorageBuffer16BitAccess = enabled.uniform_and_storage_buffer_16bit;
      v11.storagePushConstant16 = enabled.push_constant_16bit;
      v12.storageBuffer8BitAccess = enabled.storage_buffer_8bit;
      v12.uniformAndStorageBuffer8BitAccess = enabled.uniform_and_storage_buffer_8bit;
      v12.storagePushConstant8 = enabled.push_constant_8bit;
      v12.shaderFloat16 = enabled.float16;
      v12.shaderInt8 = enabled.int8;
      v12.timelineSemaphore = supported.timeline;
      features.pNext = &v11;
      v11.pNext = &v12;
      return;
    }
    void** next = &features.pNext;
    if (enabled.storage_buffer_16bit || enabled.uniform_and_storage_buffer_16bit ||
        enabled.push_constant_16bit) {
      s16.storageBuffer16BitAccess = enabled.storage_buffer_16bit;
      s16.uniformAndStorageBuffer16BitAccess = enabled.uniform_and_storage_buffer_16bit;
      s16.storagePushConstant16 = enabled.push_constant_16bit;
      *next = &s16;
      next = &s16.pNext;
    }
    if (enabled.storage_buffer_8bit || enabled.uniform_and_storage_buffer_8bit ||
        enabled.push_constant_8bit) {
      s8.storageBuffer8BitAccess = enabled.storage_buffer_8bit;
      s8.uniformAndStorageBuffer8BitAccess = enabled.uniform_and_storage_buffer_8bit;
      s8.storagePushConstant8 = enabled.push_constant_8bit;
      *next = &s8;
      next = &s8.pNext;
      extensions.push_back(VK_KHR_8BIT_STORAGE_EXTENSION_NAME);
    }
    if (enabled.float16 || enabled.int8) {
      f16i8.shaderFloat16 = enabled.float16;
      f16i8.shaderInt8 = enabled.int8;
      *next = &f16i8;
      extensions.push_back(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
    }
  }
};

}  // namespace

uint64_t ValidationErrorCount() { return g_validation_errors.load(); }

std::vector<uint32_t> PhysicalDeviceInfo::EveryComputeQueue() const {
  std::vector<uint32_t> queues;
  for (uint32_t f = 0; f < queue_families.size(); ++f) {
    if (HasCompute(f)) queues.insert(queues.end(), queue_families[f].queueCount, f);
  }
  return queues;
}

uint64_t PhysicalDeviceInfo::DeviceLocalBytes() const {
  uint64_t total = 0;
  for (uint32_t i = 0; i < memory.memoryHeapCount; ++i) {
    if (memory.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) {
      total += memory.memoryHeaps[i].size;
    }
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// Instance

absl::StatusOr<std::shared_ptr<Instance>> Instance::Create(bool validation) {
  uint32_t loader_version = VK_API_VERSION_1_0;
  if (vkEnumerateInstanceVersion(&loader_version) != VK_SUCCESS) {
    loader_version = VK_API_VERSION_1_0;
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "komputed";
  app.pEngineName = "komputed";
  app.apiVersion = std::min<uint32_t>(loader_version, VK_API_VERSION_1_3);

  std::vector<const char*> layers;
  std::vector<const char*> extensions;
  if (validation) {
    uint32_t count = 0;
    vkEnumerateInstanceLayerProperties(&count, nullptr);
    std::vector<VkLayerProperties> available(count);
    vkEnumerateInstanceLayerProperties(&count, available.data());
    bool found = std::any_of(available.begin(), available.end(), [](const VkLayerProperties& l) {
      return std::strcmp(l.layerName, kValidationLayer) == 0;
    });
    if (!found) {
      return absl::FailedPreconditionError(
          absl::StrCat("validation was asked for, but ", kValidationLayer,
                       " is not installed (Debian: vulkan-validationlayers)"));
    }
    layers.push_back(kValidationLayer);
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
  }

  // With validation, synchronization validation too (hazards between recorded commands), where
  // the layer offers it.
  const VkValidationFeatureEnableEXT enables[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT validation_features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  validation_features.enabledValidationFeatureCount = 1;
  validation_features.pEnabledValidationFeatures = enables;
  bool sync_validation = false;
  if (validation) {
    uint32_t count = 0;
    vkEnumerateInstanceExtensionProperties(kValidationLayer, &count, nullptr);
    std::vector<VkExtensionProperties> layer_extensions(count);
    vkEnumerateInstanceExtensionProperties(kValidationLayer, &count, layer_extensions.data());
    layer_extensions.resize(count);
    sync_validation = std::any_of(
        layer_extensions.begin(), layer_extensions.end(), [](const VkExtensionProperties& e) {
          return std::strcmp(e.extensionName, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME) == 0;
        });
    if (sync_validation) extensions.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
  }

  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pNext = sync_validation ? &validation_features : nullptr;
  info.pApplicationInfo = &app;
  info.enabledLayerCount = static_cast<uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  VkInstance instance = VK_NULL_HANDLE;
  KD_VK_RETURN_IF_ERROR(vkCreateInstance(&info, nullptr, &instance), "vkCreateInstance");

  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
    VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = OnValidationMessage;
    if (create != nullptr) create(instance, &mi, nullptr, &messenger);
  }
  auto result = std::shared_ptr<Instance>(new Instance(instance, validation, messenger));
  uint32_t count = 0;
  KD_VK_RETURN_IF_ERROR(vkEnumeratePhysicalDevices(instance, &count, nullptr),
                        "vkEnumeratePhysicalDevices");
  result->physical_devices_.resize(count);
  KD_VK_RETURN_IF_ERROR(
      vkEnumeratePhysicalDevices(instance, &count, result->physical_devices_.data()),
      "vkEnumeratePhysicalDevices");
  result->physical_devices_.resize(count);
  return result;
}

absl::StatusOr<std::shared_ptr<Instance>> Instance::Shared() {
  static absl::Mutex mu(absl::kConstInit);
  static std::shared_ptr<Instance>* shared = nullptr;
  absl::MutexLock lock(&mu);
  if (shared == nullptr) {
    KD_ASSIGN_OR_RETURN(auto instance, Create(EnvFlag("KOMPUTED_VALIDATION")));
    // Never destroyed: objects may outlive main's locals during static destruction.
    shared = new std::shared_ptr<Instance>(std::move(instance));
  }
  return *shared;
}

Instance::Instance(VkInstance instance, bool validation, VkDebugUtilsMessengerEXT messenger)
    : instance_(instance), validation_(validation), messenger_(messenger) {}

Instance::~Instance() {
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy != nullptr) destroy(instance_, messenger_, nullptr);
  }
  vkDestroyInstance(instance_, nullptr);
}

PhysicalDeviceInfo Instance::Describe(uint32_t index) const {
  PhysicalDeviceInfo info;
  VkPhysicalDevice pd = physical_devices_[index];
  info.index = index;
  vkGetPhysicalDeviceProperties(pd, &info.properties);
  vkGetPhysicalDeviceMemoryProperties(pd, &info.memory);
  uint32_t count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &count, nullptr);
  info.queue_families.resize(count);
  vkGetPhysicalDeviceQueueFamilyProperties(pd, &count, info.queue_families.data());
  if (info.properties.apiVersion >= VK_API_VERSION_1_3) {
    VkPhysicalDeviceMaintenance4Properties m4{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &m4;
    vkGetPhysicalDeviceProperties2(pd, &p2);
    info.max_buffer_size = m4.maxBufferSize;
  }
  return info;
}

std::vector<PhysicalDeviceInfo> Instance::Describe() const {
  std::vector<PhysicalDeviceInfo> all;
  for (uint32_t i = 0; i < physical_devices_.size(); ++i) all.push_back(Describe(i));
  return all;
}

// ---------------------------------------------------------------------------------------------
// Device

absl::StatusOr<std::vector<PhysicalDeviceInfo>> Device::List() {
  KD_ASSIGN_OR_RETURN(auto instance, Instance::Shared());
  return instance->Describe();
}

absl::StatusOr<std::shared_ptr<Device>> Device::Create(const DeviceOptions& options) {
  std::shared_ptr<Instance> instance = options.instance;
  if (instance == nullptr) {
    KD_ASSIGN_OR_RETURN(instance, Instance::Shared());
  }
  const auto& physical = instance->physical_devices();
  if (physical.empty()) {
    return absl::UnavailableError(
        "no Vulkan device found (is a driver installed? Debian: mesa-vulkan-drivers for lavapipe)");
  }
  uint32_t index = 0;
  if (options.physical_device_index.has_value()) {
    index = *options.physical_device_index;
    if (index >= physical.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device index ", index, " out of range: ", physical.size(), " device(s) present"));
    }
  } else {
    int best = 99;
    for (uint32_t i = 0; i < physical.size(); ++i) {
      int rank = TypeRank(instance->Describe(i).properties.deviceType);
      if (rank < best) best = rank, index = i;
    }
  }

  auto device = std::shared_ptr<Device>(new Device());
  device->instance_ = instance;
  device->calls_ = options.calls != nullptr ? options.calls : VulkanCalls::Default();
  device->map_device_memory_ = options.map_device_memory;
  device->physical_device_ = physical[index];
  device->info_ = instance->Describe(index);
  const PhysicalDeviceInfo& info = device->info_;
  const std::string device_name =
      absl::StrCat("device ", index, " (", info.properties.deviceName, ")");

  // Queues: one per entry, repeated entries of a family take its next queue.
  std::vector<uint32_t> families = options.queue_families;
  if (families.empty()) {
    const std::optional<uint32_t> first = info.FirstComputeFamily();
    if (!first.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(device_name, " has no compute queue"));
    }
    families.push_back(*first);
  }
  std::map<uint32_t, uint32_t> per_family;
  for (uint32_t f : families) {
    if (f >= info.queue_families.size()) {
      return absl::InvalidArgumentError(absl::StrCat("queue family ", f, " does not exist on ",
                                                     device_name, ", which has ",
                                                     info.queue_families.size(), " families"));
    }
    if (!info.HasCompute(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("queue family ", f, " of ", device_name, " has no compute capability"));
    }
    ++per_family[f];
  }
  for (const auto& [family, count] : per_family) {
    if (count > info.queue_families[family].queueCount) {
      return absl::InvalidArgumentError(
          absl::StrCat(count, " queues requested from queue family ", family, " of ", device_name,
                       ", which has ", info.queue_families[family].queueCount, " queue(s)"));
    }
  }
  std::vector<std::vector<float>> priorities;
  std::vector<VkDeviceQueueCreateInfo> queue_infos;
  priorities.reserve(per_family.size());
  for (const auto& [family, count] : per_family) {
    priorities.emplace_back(count, 1.0f);
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = family;
    qi.queueCount = count;
    qi.pQueuePriorities = priorities.back().data();
    queue_infos.push_back(qi);
  }

  // Extensions: those the device lacks are skipped.
  uint32_t ext_count = 0;
  vkEnumerateDeviceExtensionProperties(device->physical_device_, nullptr, &ext_count, nullptr);
  std::vector<VkExtensionProperties> available(ext_count);
  vkEnumerateDeviceExtensionProperties(device->physical_device_, nullptr, &ext_count,
                                       available.data());
  for (const std::string& wanted : options.extensions) {
    bool found = std::any_of(available.begin(), available.end(),
                             [&](const auto& e) { return wanted == e.extensionName; });
    if (found) {
      device->enabled_extensions_.push_back(wanted);
    } else {
      device->skipped_extensions_.push_back(wanted);
      spdlog::warn("{}: extension {} is not supported; skipped", device_name, wanted);
    }
  }

  // Features that shaders commonly need, where the device has them (less those withheld), and
  // robust buffer access (out-of-bounds accesses stay inside the buffer's memory) for shaders of
  // untrusted clients.
  VkPhysicalDeviceFeatures supported{};
  vkGetPhysicalDeviceFeatures(device->physical_device_, &supported);
  SupportedFeatures query;
  query.Query(device->physical_device_,
              std::min(info.properties.apiVersion,
                       options.feature_api_version.value_or(info.properties.apiVersion)),
              available);
  const ShaderFeatures& withheld = options.withheld_features;
  ShaderFeatures& enabled = device->features_;
  enabled.float64 = supported.shaderFloat64 == VK_TRUE && !withheld.float64;
  enabled.int64 = supported.shaderInt64 == VK_TRUE && !withheld.int64;
  enabled.int16 = supported.shaderInt16 == VK_TRUE && !withheld.int16;
  enabled.float16 = query.float16 && !withheld.float16;
  enabled.int8 = query.int8 && !withheld.int8;
  enabled.storage_buffer_8bit = query.storage_buffer_8bit && !withheld.storage_buffer_8bit;
  enabled.storage_buffer_16bit = query.storage_buffer_16bit && !withheld.storage_buffer_16bit;
  enabled.uniform_and_storage_buffer_8bit =
      query.uniform_and_storage_buffer_8bit && !withheld.uniform_and_storage_buffer_8bit;
  enabled.uniform_and_storage_buffer_16bit =
      query.uniform_and_storage_buffer_16bit && !withheld.uniform_and_storage_buffer_16bit;
  enabled.push_constant_8bit = query.push_constant_8bit && !withheld.push_constant_8bit;
  enabled.push_constant_16bit = query.push_constant_16bit && !withheld.push_constant_16bit;
  enabled.storage_image_extended_formats = supported.shaderStorageImageExtendedFormats == VK_TRUE;
  enabled.storage_image_read_without_format =
      supported.shaderStorageImageReadWithoutFormat == VK_TRUE;
  enabled.storage_image_write_without_format =
      supported.shaderStorageImageWriteWithoutFormat == VK_TRUE;
  device->robust_buffer_access_ = supported.robustBufferAccess == VK_TRUE;
  device->timeline_ = query.timeline;

  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.features.robustBufferAccess = supported.robustBufferAccess;
  features.features.shaderFloat64 = enabled.float64;
  features.features.shaderInt64 = enabled.int64;
  features.features.shaderInt16 = enabled.int16;
  features.features.shaderStorageImageExtendedFormats = enabled.storage_image_extended_formats;
  features.features.shaderStorageImageReadWithoutFormat = enabled.storage_image_read_without_format;
  features.features.shaderStorageImageWriteWithoutFormat =
      enabled.storage_image_write_without_format;
  EnabledFeatures enable;
  enable.Chain(features, query, enabled);
  // Robust image access, for shaders that bind images: core in Vulkan 1.3, else the extension.
  VkPhysicalDeviceImageRobustnessFeatures image_robustness{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_IMAGE_ROBUSTNESS_FEATURES};
  {
    const bool core_1_3 = info.properties.apiVersion >= VK_API_VERSION_1_3 &&
                          !options.feature_api_version.has_value();
    const bool extension = HasExtension(available, VK_EXT_IMAGE_ROBUSTNESS_EXTENSION_NAME);
    if (info.properties.apiVersion >= VK_API_VERSION_1_1 && (core_1_3 || extension)) {
      VkPhysicalDeviceImageRobustnessFeatures q{
          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_IMAGE_ROBUSTNESS_FEATURES};
      VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
      f2.pNext = &q;
      vkGetPhysicalDeviceFeatures2(device->physical_device_, &f2);
      if (q.robustImageAccess == VK_TRUE) {
        image_robustness.robustImageAccess = VK_TRUE;
        void** next = &features.pNext;
        while (*next != nullptr) {
          next = reinterpret_cast<void**>(&static_cast<VkBaseOutStructure*>(*next)->pNext);
        }
        *next = &image_robustness;
        device->robust_image_access_ = true;
        if (!core_1_3) enable.extensions.push_back(VK_EXT_IMAGE_ROBUSTNESS_EXTENSION_NAME);
      }
    }
  }
  for (const char* e : enable.extensions) {
    if (std::find(device->enabled_extensions_.begin(), device->enabled_extensions_.end(), e) ==
        device->enabled_extensions_.end()) {
      device->enabled_extensions_.push_back(e);
    }
  }
  // Host memory import (VK_EXT_external_memory_host; VK_KHR_external_memory is core in 1.1):
  // tensors whose host data is memory that another process shares with this one.
  if (info.properties.apiVersion >= VK_API_VERSION_1_1 &&
      HasExtension(available, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME)) {
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &host;
    vkGetPhysicalDeviceProperties2(device->physical_device_, &p2);
    if (host.minImportedHostPointerAlignment != 0) {
      device->host_import_alignment_ = host.minImportedHostPointerAlignment;
      if (std::find(device->enabled_extensions_.begin(), device->enabled_extensions_.end(),
                    VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) ==
          device->enabled_extensions_.end()) {
        device->enabled_extensions_.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
      }
    }
  }
  std::vector<const char*> extension_names;
  for (const std::string& e : device->enabled_extensions_) extension_names.push_back(e.c_str());

  device->dispatch_share_ = options.dispatch_share;
  device->resident_invocations_ = options.invocation_slots;
  if (info.properties.apiVersion >= VK_API_VERSION_1_1) {
    VkPhysicalDeviceSubgroupProperties subgroup{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    p2.pNext = &subgroup;
    // The compute units, where the device reports them (the extensions need only be present).
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV nv{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amd{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    const bool has_nv = HasExtension(available, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
    const bool has_amd = HasExtension(available, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME);
    if (has_nv) {
      nv.pNext = p2.pNext;
      p2.pNext = &nv;
    }
    if (has_amd) {
      amd.pNext = p2.pNext;
      p2.pNext = &amd;
    }
    vkGetPhysicalDeviceProperties2(device->physical_device_, &p2);
    if (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) {
      enabled.subgroup_operations = subgroup.supportedOperations & ~withheld.subgroup_operations;
    }
    device->subgroup_size_ = subgroup.subgroupSize;
    if (options.invocation_slots != 0) {
      // As the options say.
    } else if (has_nv) {
      device->resident_invocations_ =
          uint64_t{nv.shaderSMCount} * nv.shaderWarpsPerSM * subgroup.subgroupSize;
    } else if (has_amd) {
      device->resident_invocations_ = uint64_t{amd.shaderEngineCount} *
                                      amd.shaderArraysPerEngineCount *
                                      amd.computeUnitsPerShaderArray * amd.simdPerComputeUnit *
                                      amd.wavefrontsPerSimd * amd.wavefrontSize;
    }
  }

  VkDeviceCreateInfo create{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  create.pNext = &features;
  create.queueCreateInfoCount = static_cast<uint32_t>(queue_infos.size());
  create.pQueueCreateInfos = queue_infos.data();
  create.enabledExtensionCount = static_cast<uint32_t>(extension_names.size());
  create.ppEnabledExtensionNames = extension_names.data();
  KD_VK_RETURN_IF_ERROR(
      vkCreateDevice(device->physical_device_, &create, nullptr, &device->device_),
      absl::StrCat("vkCreateDevice on ", device_name));
  if (device->host_import_alignment_ != 0) {
    device->get_host_pointer_properties_ =
        reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
            vkGetDeviceProcAddr(device->device_, "vkGetMemoryHostPointerPropertiesEXT"));
    if (device->get_host_pointer_properties_ == nullptr) device->host_import_alignment_ = 0;
  }

  std::map<uint32_t, uint32_t> next_in_family;
  for (uint32_t f : families) {
    auto queue = std::make_unique<Queue>();
    queue->family = f;
    queue->index = next_in_family[f]++;
    queue->timestamp_valid_bits = info.queue_families[f].timestampValidBits;
    vkGetDeviceQueue(device->device_, f, queue->index, &queue->handle);
    device->queues_.push_back(std::move(queue));
  }

  {
    absl::MutexLock lock(&device->once_mu_);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pi.queueFamilyIndex = families[0];
    VkCommandPool pool = VK_NULL_HANDLE;
    KD_VK_RETURN_IF_ERROR(vkCreateCommandPool(device->device_, &pi, nullptr, &pool),
                          "vkCreateCommandPool");
    device->once_pool_ = CommandPoolHandle(device->device_, pool);
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence = VK_NULL_HANDLE;
    KD_VK_RETURN_IF_ERROR(vkCreateFence(device->device_, &fi, nullptr, &fence), "vkCreateFence");
    device->once_fence_ = FenceHandle(device->device_, fence);
  }
  return device;
}

Device::~Device() {
  if (device_ == VK_NULL_HANDLE) return;
  if (!unresponsive_.load()) vkDeviceWaitIdle(device_);
  {
    absl::MutexLock lock(&once_mu_);
    once_pool_.Reset();
    once_fence_.Reset();
  }
  vkDestroyDevice(device_, nullptr);
}

absl::StatusOr<uint32_t> Device::FindMemoryType(uint32_t type_bits, VkMemoryPropertyFlags required,
                                                VkMemoryPropertyFlags preferred) const {
  const auto& mem = info_.memory;
  int fallback = -1;
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    if ((type_bits & (1u << i)) == 0) continue;
    VkMemoryPropertyFlags flags = mem.memoryTypes[i].propertyFlags;
    if ((flags & required) != required) continue;
    if ((flags & preferred) == preferred) return i;
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  if (fallback >= 0) return static_cast<uint32_t>(fallback);
  return absl::NotFoundError(absl::StrCat("device ", info_.index, " (", info_.properties.deviceName,
                                          ") has no memory type with properties 0x",
                                          absl::Hex(required)));
}

uint64_t Device::HeapSize(uint32_t memory_type) const {
  return info_.memory.memoryHeaps[info_.memory.memoryTypes[memory_type].heapIndex].size;
}

uint32_t Device::ResidentWorkgroupLimit(uint64_t local_invocations, double share) const {
  if (!(share > 0.0 && share < 1.0) || resident_invocations_ == 0) return 0;
  const uint64_t subgroup = std::max<uint64_t>(subgroup_size_, 1);
  const uint64_t slots = std::max<uint64_t>(local_invocations, 1);
  // A workgroup counts as at least two subgroups: GPUs keep at most half as many workgroups as
  // subgroups on a compute unit (NVIDIA's SMs since Volta: 32 of 64 or fewer), so that small
  // workgroups run out of workgroup places before invocation slots.
  const uint64_t per_workgroup =
      std::max((slots + subgroup - 1) / subgroup * subgroup, 2 * subgroup);
  const double limit =
      share * static_cast<double>(resident_invocations_) / static_cast<double>(per_workgroup);
  return static_cast<uint32_t>(std::clamp(limit, 1.0, 65535.0));
}

void Device::MarkLost(absl::string_view why) {
  unresponsive_.store(true);
  if (!lost_.exchange(true)) {
    spdlog::error("device {} ({}) declared lost: {}", info_.index, info_.properties.deviceName,
                  std::string(why));
  }
}

absl::Status Device::Check(VkResult result, absl::string_view what) {
  if (result == VK_ERROR_DEVICE_LOST && !lost_.exchange(true)) {
    spdlog::error("device {} ({}) lost during {}", info_.index, info_.properties.deviceName,
                  std::string(what));
  }
  return VkStatus(result, what);
}

absl::StatusOr<MemoryHandle> Device::AllocateMemory(uint64_t size, uint32_t type,
                                                    absl::string_view what) {
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = size;
  ai.memoryTypeIndex = type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(Check(calls_->AllocateMemory(handle(), &ai, &memory),
                           absl::StrCat("vkAllocateMemory of ", size, " bytes for ", what)));
  return MemoryHandle(handle(), memory);
}

absl::Status Device::Submit(size_t queue, VkCommandBuffer command_buffer, VkFence fence,
                            VkSemaphore timeline, uint64_t timeline_value, VkCommandBuffer prologue,
                            uint64_t* order) {
  const SubmitItem item{command_buffer, prologue, timeline, timeline_value};
  return SubmitBatch(queue, absl::MakeConstSpan(&item, 1), fence, order);
}

absl::Status Device::SubmitBatch(size_t queue, absl::Span<const SubmitItem> items, VkFence fence,
                                 uint64_t* first_order) {
  if (lost()) {
    return absl::UnavailableError(absl::StrCat("device ", info_.index, " was lost"));
  }
  if (queue >= queues_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue ", queue, " out of range: the device has ", queues_.size()));
  }
  if (items.empty()) return absl::InvalidArgumentError("a submission of no command buffers");
  // Each item's command buffers (its prologue first), its submit info and its timeline info;
  // sized up front so that the pointers between them stay put.
  // Inline for one submission, so that Sequence::Submit allocates nothing here.
  absl::InlinedVector<VkCommandBuffer, 2> buffers(2 * items.size());
  absl::InlinedVector<VkSubmitInfo, 1> infos(items.size(),
                                             VkSubmitInfo{VK_STRUCTURE_TYPE_SUBMIT_INFO});
  absl::InlinedVector<VkTimelineSemaphoreSubmitInfo, 1> timelines(
      items.size(),
      VkTimelineSemaphoreSubmitInfo{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO});
  for (size_t i = 0; i < items.size(); ++i) {
    const SubmitItem& item = items[i];
    VkCommandBuffer* mine = &buffers[2 * i];
    uint32_t count = 0;
    if (item.prologue != VK_NULL_HANDLE) mine[count++] = item.prologue;
    mine[count++] = item.command_buffer;
    VkSubmitInfo& si = infos[i];
    si.commandBufferCount = count;
    si.pCommandBuffers = mine;
    if (item.timeline != VK_NULL_HANDLE) {
      VkTimelineSemaphoreSubmitInfo& ti = timelines[i];
      ti.signalSemaphoreValueCount = 1;
      ti.pSignalSemaphoreValues = &item.timeline_value;
      si.pNext = &ti;
      si.signalSemaphoreCount = 1;
      si.pSignalSemaphores = &item.timeline;
    }
  }
  Queue& q = *queues_[queue];
  VkResult r;
  {
    absl::MutexLock lock(&q.mu);
    r = calls_->QueueSubmit(q.handle, static_cast<uint32_t>(infos.size()), infos.data(), fence);
    if (first_order != nullptr) *first_order = q.submissions + 1;
    if (r == VK_SUCCESS) q.submissions += items.size();
  }
  return Check(r, "vkQueueSubmit");
}

absl::Status Device::Wait(VkFence fence, absl::Duration timeout) {
  VkResult r = calls_->WaitForFences(device_, 1, &fence, VK_TRUE, TimeoutNs(timeout));
  if (r == VK_TIMEOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("the submission did not complete within ", absl::FormatDuration(timeout)));
  }
  return Check(r, "vkWaitForFences");
}

absl::Status Device::WaitTimeline(VkSemaphore timeline, uint64_t value, absl::Duration timeout) {
  VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &timeline;
  wi.pValues = &value;
  VkResult r = calls_->WaitSemaphores(device_, &wi, TimeoutNs(timeout));
  if (r == VK_TIMEOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("the submission did not complete within ", absl::FormatDuration(timeout)));
  }
  return Check(r, "vkWaitSemaphores");
}

absl::Status Device::RunOnce(const std::function<void(VkCommandBuffer)>& record,
                             absl::Duration timeout) {
  absl::MutexLock lock(&once_mu_);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = once_pool_.get();
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      Check(vkAllocateCommandBuffers(device_, &ai, &cb), "vkAllocateCommandBuffers"));
  struct Free {
    VkDevice d;
    VkCommandPool p;
    VkCommandBuffer cb;
    ~Free() { vkFreeCommandBuffers(d, p, 1, &cb); }
  } free_cb{device_, once_pool_.get(), cb};
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  KD_RETURN_IF_ERROR(Check(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer"));
  record(cb);
  KD_RETURN_IF_ERROR(Check(vkEndCommandBuffer(cb), "vkEndCommandBuffer"));
  VkFence fence = once_fence_.get();
  KD_RETURN_IF_ERROR(Check(vkResetFences(device_, 1, &fence), "vkResetFences"));
  KD_RETURN_IF_ERROR(Submit(0, cb, fence));
  absl::Status waited = Wait(fence, timeout);
  if (!waited.ok()) {
    // The commands may still run, on the caller's buffers: the caller frees those when this
    // returns, so the device must be idle first.
    vkDeviceWaitIdle(device_);
  }
  return waited;
}

std::shared_ptr<const void> Device::Shared(const std::string& key) const {
  absl::MutexLock lock(&shared_mu_);
  auto it = shared_.find(key);
  return it == shared_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<const void> Device::Share(const std::string& key,
                                          std::shared_ptr<const void> object) {
  absl::MutexLock lock(&shared_mu_);
  std::weak_ptr<const void>& slot = shared_[key];
  if (std::shared_ptr<const void> filed = slot.lock()) return filed;
  slot = object;
  // Keys whose objects are gone are dropped once the map has doubled since the last sweep.
  if (shared_.size() >= shared_sweep_at_) {
    absl::erase_if(shared_, [](const auto& entry) { return entry.second.expired(); });
    shared_sweep_at_ = std::max<size_t>(64, 2 * shared_.size());
  }
  return object;
}

size_t Device::shared_count() const {
  absl::MutexLock lock(&shared_mu_);
  size_t live = 0;
  for (const auto& entry : shared_) live += entry.second.expired() ? 0 : 1;
  return live;
}

}  // namespace komputed::core
