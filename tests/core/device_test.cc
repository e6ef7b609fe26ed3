// Tests of Instance and Device: creation, options and their errors, memory types.

#include "komputed/core/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "support/status_matchers.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

// The physical device Device::Create picks by default.
uint32_t DefaultIndex(const std::shared_ptr<Device>& device) { return device->info().index; }

TEST(Device, CreateWithDefaults) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  ASSERT_NE(device, nullptr);
  EXPECT_NE(device->handle(), VK_NULL_HANDLE);
  EXPECT_NE(device->physical_device(), VK_NULL_HANDLE);
  ASSERT_GE(device->queue_count(), 1u);
  const Queue& q = device->queue(0);
  EXPECT_NE(q.handle, VK_NULL_HANDLE);
  EXPECT_EQ(q.index, 0u);
  EXPECT_TRUE(device->info().HasCompute(q.family));
  EXPECT_EQ(std::optional<uint32_t>(q.family), device->info().FirstComputeFamily());
  EXPECT_GT(std::strlen(device->properties().deviceName), 0u);
  EXPECT_FALSE(device->lost());
  // None asked for; the device enables on its own only what it uses where offered.
  for (const std::string& e : device->enabled_extensions()) {
    EXPECT_TRUE(e == VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME ||
                e == VK_EXT_IMAGE_ROBUSTNESS_EXTENSION_NAME)
        << e;
  }
  EXPECT_TRUE(device->skipped_extensions().empty());
  EXPECT_GT(device->limits().maxComputeWorkGroupCount[0], 0u);
  RecordProperty("device", device->properties().deviceName);
}

// Robust buffer access and the shader features are enabled where the device has them.
TEST(Device, EnablesWhatShadersMayUse) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  VkPhysicalDeviceFeatures supported{};
  vkGetPhysicalDeviceFeatures(device->physical_device(), &supported);
  EXPECT_EQ(device->robust_buffer_access(), supported.robustBufferAccess == VK_TRUE);
  const ShaderFeatures& f = device->shader_features();
  EXPECT_EQ(f.float64, supported.shaderFloat64 == VK_TRUE);
  EXPECT_EQ(f.int64, supported.shaderInt64 == VK_TRUE);
  EXPECT_EQ(f.int16, supported.shaderInt16 == VK_TRUE);
  EXPECT_EQ(device->float64_supported(), f.float64);
  if (device->properties().apiVersion >= VK_API_VERSION_1_1) {
    // Every Vulkan 1.1 device has basic subgroup operations in compute shaders.
    EXPECT_NE(f.subgroup_operations & VK_SUBGROUP_FEATURE_BASIC_BIT, 0u);
  }
  if (device->properties().apiVersion >= VK_API_VERSION_1_2) {
    VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 query{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    query.pNext = &v11;
    v11.pNext = &v12;
    vkGetPhysicalDeviceFeatures2(device->physical_device(), &query);
    EXPECT_EQ(f.storage_buffer_16bit, v11.storageBuffer16BitAccess == VK_TRUE);
    EXPECT_EQ(f.uniform_and_storage_buffer_16bit,
              v11.uniformAndStorageBuffer16BitAccess == VK_TRUE);
    EXPECT_EQ(f.push_constant_16bit, v11.storagePushConstant16 == VK_TRUE);
    EXPECT_EQ(f.storage_buffer_8bit, v12.storageBuffer8BitAccess == VK_TRUE);
    EXPECT_EQ(f.uniform_and_storage_buffer_8bit, v12.uniformAndStorageBuffer8BitAccess == VK_TRUE);
    EXPECT_EQ(f.push_constant_8bit, v12.storagePushConstant8 == VK_TRUE);
    EXPECT_EQ(f.float16, v12.shaderFloat16 == VK_TRUE);
    EXPECT_EQ(f.int8, v12.shaderInt8 == VK_TRUE);
    RecordProperty("shaderInt8", f.int8);
    RecordProperty("shaderFloat16", f.float16);
    RecordProperty("storageBuffer8BitAccess", f.storage_buffer_8bit);
    RecordProperty("storageBuffer16BitAccess", f.storage_buffer_16bit);
  }
}

// Features can be withheld: the device is opened without them, as one that lacks them.
TEST(Device, WithheldFeaturesAreLeftDisabled) {
  DeviceOptions options;
  options.withheld_features.float64 = true;
  options.withheld_features.int16 = true;
  options.withheld_features.storage_buffer_8bit = true;
  options.withheld_features.subgroup_operations = VK_SUBGROUP_FEATURE_BALLOT_BIT;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> full, Device::Create({}));
  const ShaderFeatures& f = device->shader_features();
  EXPECT_FALSE(f.float64);
  EXPECT_FALSE(device->float64_supported());
  EXPECT_FALSE(f.int16);
  EXPECT_FALSE(f.storage_buffer_8bit);
  EXPECT_EQ(f.subgroup_operations & VK_SUBGROUP_FEATURE_BALLOT_BIT, 0u);
  // The others as on a device opened with nothing withheld.
  const ShaderFeatures& all = full->shader_features();
  EXPECT_EQ(f.storage_buffer_16bit, all.storage_buffer_16bit);
  EXPECT_EQ(f.int8, all.int8);
  EXPECT_EQ(f.float16, all.float16);
  EXPECT_EQ(f.subgroup_operations,
            all.subgroup_operations & ~uint32_t{VK_SUBGROUP_FEATURE_BALLOT_BIT});
}

TEST(Device, ListDescribesEveryPhysicalDevice) {
  ASSERT_OK_AND_ASSIGN(std::vector<PhysicalDeviceInfo> all, Device::List());
  ASSERT_FALSE(all.empty());
  for (uint32_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i].properties.deviceName);
    EXPECT_EQ(all[i].index, i);
    EXPECT_GT(std::strlen(all[i].properties.deviceName), 0u);
    EXPECT_FALSE(all[i].queue_families.empty());
    EXPECT_GT(all[i].memory.memoryTypeCount, 0u);
  }
}

TEST(Device, CreateByIndexMatchesList) {
  ASSERT_OK_AND_ASSIGN(std::vector<PhysicalDeviceInfo> all, Device::List());
  DeviceOptions options;
  options.physical_device_index = static_cast<uint32_t>(all.size() - 1);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  EXPECT_EQ(device->info().index, all.size() - 1);
  EXPECT_STREQ(device->properties().deviceName, all.back().properties.deviceName);
}

TEST(Device, PhysicalDeviceIndexOutOfRange) {
  ASSERT_OK_AND_ASSIGN(std::vector<PhysicalDeviceInfo> all, Device::List());
  DeviceOptions options;
  options.physical_device_index = static_cast<uint32_t>(all.size());
  EXPECT_THAT(Device::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("device index ", all.size()))));
  options.physical_device_index = 1000;
  EXPECT_THAT(Device::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1000")));
}

TEST(Device, QueueFamilyThatDoesNotExist) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  const uint32_t families = static_cast<uint32_t>(device->info().queue_families.size());
  DeviceOptions options;
  options.physical_device_index = DefaultIndex(device);
  options.queue_families = {families};
  EXPECT_THAT(Device::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("queue family ", families, " does not exist"))));
  // A valid entry first does not hide the invalid one after it.
  options.queue_families = {device->queue(0).family, 77};
  EXPECT_THAT(Device::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("queue family 77")));
}

TEST(Device, MoreQueuesThanTheFamilyHas) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  const uint32_t family = device->queue(0).family;
  const uint32_t count = device->info().queue_families[family].queueCount;
  DeviceOptions options;
  options.physical_device_index = DefaultIndex(device);
  options.queue_families.assign(count + 1, family);
  EXPECT_THAT(Device::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(absl::StrCat(count + 1, " queues requested")),
                             HasSubstr(absl::StrCat("has ", count, " queue(s)")))));
}

TEST(Device, EveryQueueOfTheFamily) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> first, Device::Create({}));
  const uint32_t family = first->queue(0).family;
  const uint32_t count = first->info().queue_families[family].queueCount;
  DeviceOptions options;
  options.physical_device_index = DefaultIndex(first);
  // Cap the count: some drivers advertise many queues and each costs resources.
  options.queue_families.assign(std::min<uint32_t>(count, 4), family);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  ASSERT_EQ(device->queue_count(), options.queue_families.size());
  for (size_t i = 0; i < device->queue_count(); ++i) {
    EXPECT_EQ(device->queue(i).family, family);
    EXPECT_EQ(device->queue(i).index, i);
    EXPECT_NE(device->queue(i).handle, VK_NULL_HANDLE);
  }
}

TEST(Device, UnknownExtensionIsSkipped) {
  DeviceOptions options;
  options.extensions = {"VK_KOMPUTED_no_such_extension"};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  EXPECT_THAT(device->skipped_extensions(), Contains("VK_KOMPUTED_no_such_extension"));
  EXPECT_THAT(device->enabled_extensions(), Not(Contains("VK_KOMPUTED_no_such_extension")));
}

TEST(Device, SupportedExtensionIsEnabled) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> probe, Device::Create({}));
  uint32_t count = 0;
  vkEnumerateDeviceExtensionProperties(probe->physical_device(), nullptr, &count, nullptr);
  std::vector<VkExtensionProperties> available(count);
  vkEnumerateDeviceExtensionProperties(probe->physical_device(), nullptr, &count, available.data());
  // Any extension without dependencies would do; these are widespread and standalone.
  std::string wanted;
  for (const char* name : {"VK_KHR_shader_non_semantic_info", "VK_KHR_shader_clock",
                           "VK_KHR_shader_terminate_invocation"}) {
    for (const auto& e : available) {
      if (wanted.empty() && std::strcmp(e.extensionName, name) == 0) wanted = name;
    }
  }
  if (wanted.empty()) GTEST_SKIP() << "none of the probe extensions is supported";
  DeviceOptions options;
  options.physical_device_index = DefaultIndex(probe);
  options.extensions = {wanted, "VK_KOMPUTED_no_such_extension"};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  EXPECT_THAT(device->enabled_extensions(), Contains(wanted));
  EXPECT_THAT(device->skipped_extensions(), Contains("VK_KOMPUTED_no_such_extension"));
  EXPECT_THAT(device->skipped_extensions(), Not(Contains(wanted)));
}

TEST(Device, FindMemoryType) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  const VkPhysicalDeviceMemoryProperties& mem = device->info().memory;
  const uint32_t all_types = mem.memoryTypeCount >= 32 ? ~0u : (1u << mem.memoryTypeCount) - 1;

  // Every device has host-visible, host-coherent memory.
  constexpr VkMemoryPropertyFlags kHostVisible =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  ASSERT_OK_AND_ASSIGN(uint32_t host, device->FindMemoryType(all_types, kHostVisible));
  ASSERT_LT(host, mem.memoryTypeCount);
  EXPECT_EQ(mem.memoryTypes[host].propertyFlags & kHostVisible, kHostVisible);
  EXPECT_GT(device->HeapSize(host), 0u);

  // ...and device-local memory.
  ASSERT_OK_AND_ASSIGN(uint32_t local,
                       device->FindMemoryType(all_types, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT));
  EXPECT_TRUE(mem.memoryTypes[local].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);

  // Only the types in type_bits are candidates.
  ASSERT_OK_AND_ASSIGN(uint32_t only, device->FindMemoryType(1u << host, kHostVisible));
  EXPECT_EQ(only, host);

  // A preferred property is taken when some type has it.
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags flags = mem.memoryTypes[i].propertyFlags;
    if ((flags & kHostVisible) == kHostVisible && (flags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT)) {
      ASSERT_OK_AND_ASSIGN(
          uint32_t cached,
          device->FindMemoryType(all_types, kHostVisible, VK_MEMORY_PROPERTY_HOST_CACHED_BIT));
      EXPECT_TRUE(mem.memoryTypes[cached].propertyFlags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
      break;
    }
  }

  // No candidate types: NOT_FOUND.
  EXPECT_THAT(device->FindMemoryType(0, kHostVisible), StatusIs(absl::StatusCode::kNotFound));
}

TEST(Device, TwoDevicesAreIndependent) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> a, Device::Create({}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> b, Device::Create({}));
  EXPECT_NE(a->handle(), b->handle());
  EXPECT_EQ(a->physical_device(), b->physical_device());
  a.reset();
  EXPECT_FALSE(b->lost());
  // b still works after a is gone.
  EXPECT_TRUE(b->RunOnce([](VkCommandBuffer) {}).ok());
}

TEST(Device, RunOnceRunsCommands) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  bool recorded = false;
  ASSERT_OK(device->RunOnce([&](VkCommandBuffer cb) { recorded = cb != VK_NULL_HANDLE; }));
  EXPECT_TRUE(recorded);
  // The pool and fence are reused.
  ASSERT_OK(device->RunOnce([](VkCommandBuffer) {}));
}

TEST(Device, SubmitToQueueOutOfRange) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  EXPECT_THAT(device->Submit(device->queue_count(), VK_NULL_HANDLE, VK_NULL_HANDLE),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
}

TEST(Instance, SharedIsShared) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Instance> a, Instance::Shared());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Instance> b, Instance::Shared());
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a->handle(), VK_NULL_HANDLE);
  EXPECT_FALSE(a->physical_devices().empty());
  EXPECT_EQ(a->Describe().size(), a->physical_devices().size());
}

TEST(Instance, DeviceOnItsOwnInstance) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Instance> instance, Instance::Create(false));
  EXPECT_FALSE(instance->validation());
  DeviceOptions options;
  options.instance = instance;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  // The device keeps the instance alive.
  instance.reset();
  ASSERT_OK(device->RunOnce([](VkCommandBuffer) {}));
}

}  // namespace
}  // namespace komputed::core
