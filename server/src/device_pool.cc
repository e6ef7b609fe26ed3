#include "device_pool.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "komputed/core/status.h"

namespace komputed::server {

absl::StatusOr<std::unique_ptr<PooledDevice>> PooledDevice::Open(
    uint32_t pool_index, uint32_t physical_index, const DevicePoolOptions& pool_options) {
  KD_ASSIGN_OR_RETURN(std::vector<core::PhysicalDeviceInfo> all, core::Device::List());
  if (physical_index >= all.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", physical_index, " does not exist: ", all.size(), " Vulkan device(s) present"));
  }
  const core::PhysicalDeviceInfo& info = all[physical_index];
  core::DeviceOptions options;
  options.physical_device_index = physical_index;
  options.calls = pool_options.vulkan_calls;
  for (uint32_t f = 0; f < info.queue_families.size(); ++f) {
    if (!info.HasCompute(f)) continue;
    for (uint32_t q = 0; q < info.queue_families[f].queueCount; ++q) {
      options.queue_families.push_back(f);
    }
  }
  if (options.queue_families.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", physical_index, " (", info.properties.deviceName, ") has no compute queue"));
  }
  auto pooled = std::unique_ptr<PooledDevice>(new PooledDevice());
  pooled->index_ = pool_index;
  KD_ASSIGN_OR_RETURN(pooled->device_, core::Device::Create(options));
  KD_ASSIGN_OR_RETURN(pooled->waiter_, core::CompletionWaiter::Create(pooled->device_));
  for (uint32_t i = 0; i < pooled->device_->queue_count(); ++i) {
    const core::Queue& q = pooled->device_->queue(i);
    pooled->queue_index_[{q.family, q.index}] = i;
  }
  Metrics& m = *pool_options.metrics;
  const std::string device = absl::StrCat(pool_index);
  pooled->memory_used_ = &m.device_memory_used_bytes(device);
  m.device_memory_limit_bytes(device).Set(static_cast<double>(info.DeviceLocalBytes()));
  pooled->losses_ = &m.device_losses_total(device);
  for (uint32_t i = 0; i < pooled->device_->queue_count(); ++i) {
    const std::string queue = absl::StrCat(i);
    pooled->queue_metrics_.push_back({&m.submissions_total(device, queue),
                                      &m.gpu_execution_seconds_total(device, queue),
                                      &m.queue_depth(device, queue)});
  }
  spdlog::info("device {}: {} (Vulkan device {}), {} queue(s), timeline semaphores: {}", pool_index,
               info.properties.deviceName, physical_index, pooled->device_->queue_count(),
               pooled->device_->timeline_supported());
  return pooled;
}

absl::StatusOr<std::vector<uint32_t>> PooledDevice::ResolveQueues(
    const std::vector<uint32_t>& families) const {
  const core::PhysicalDeviceInfo& info = device_->info();
  std::vector<uint32_t> wanted = families;
  if (wanted.empty()) {
    for (uint32_t f = 0; f < info.queue_families.size(); ++f) {
      if (info.HasCompute(f)) {
        wanted.push_back(f);
        break;
      }
    }
  }
  std::vector<uint32_t> result;
  std::map<uint32_t, uint32_t> next_in_family;
  for (uint32_t family : wanted) {
    if (family >= info.queue_families.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("queue family ", family, " does not exist on device ", index_,
                       ", which has ", info.queue_families.size(), " queue famil",
                       info.queue_families.size() == 1 ? "y" : "ies"));
    }
    if (!info.HasCompute(family)) {
      return absl::InvalidArgumentError(absl::StrCat("queue family ", family, " of device ", index_,
                                                     " has no compute capability"));
    }
    const uint32_t in_family = next_in_family[family]++;
    auto it = queue_index_.find(std::make_pair(family, in_family));
    if (it == queue_index_.end()) {
      uint32_t asked = 0;
      for (uint32_t f : wanted) asked += f == family ? 1 : 0;
      return absl::InvalidArgumentError(
          absl::StrCat(asked, " queues requested from queue family ", family, " of device ", index_,
                       ", which has ", info.queue_families[family].queueCount, " queue(s)"));
    }
    result.push_back(it->second);
  }
  return result;
}

void PooledDevice::AddMemory(int64_t bytes) {
  memory_in_use_.fetch_add(bytes, std::memory_order_relaxed);
  memory_used_->Increment(static_cast<double>(bytes));
}

void PooledDevice::Submitted(size_t queue) {
  if (queue >= queue_metrics_.size()) return;
  queue_metrics_[queue].submissions->Increment();
  queue_metrics_[queue].depth->Increment();
}

void PooledDevice::Completed(size_t queue, uint64_t gpu_ns) {
  if (queue >= queue_metrics_.size()) return;
  queue_metrics_[queue].depth->Decrement();
  if (gpu_ns > 0) queue_metrics_[queue].gpu_seconds->Increment(static_cast<double>(gpu_ns) * 1e-9);
}

void PooledDevice::CheckLost() {
  if (!device_->lost() || loss_reported_.exchange(true)) return;
  losses_->Increment();
  spdlog::error(
      "device {} ({}) was lost (VK_ERROR_DEVICE_LOST): its sessions' calls fail with "
      "UNAVAILABLE",
      index_, device_->properties().deviceName);
  if (on_loss_) on_loss_();
}

void PooledDevice::Describe(v1::DeviceInfo* out) const {
  const core::PhysicalDeviceInfo& info = device_->info();
  const VkPhysicalDeviceProperties& p = info.properties;
  out->set_index(index_);
  out->set_name(p.deviceName);
  out->set_vendor_id(p.vendorID);
  out->set_device_id(p.deviceID);
  out->set_device_type(static_cast<uint32_t>(p.deviceType));
  out->set_api_version(p.apiVersion);
  out->set_driver_version(p.driverVersion);
  for (uint32_t f = 0; f < info.queue_families.size(); ++f) {
    const VkQueueFamilyProperties& qf = info.queue_families[f];
    v1::QueueFamily* family = out->add_queue_families();
    family->set_index(f);
    family->set_queue_count(qf.queueCount);
    family->set_compute((qf.queueFlags & VK_QUEUE_COMPUTE_BIT) != 0);
    family->set_transfer((qf.queueFlags & VK_QUEUE_TRANSFER_BIT) != 0);
    family->set_graphics((qf.queueFlags & VK_QUEUE_GRAPHICS_BIT) != 0);
    family->set_timestamp_valid_bits(qf.timestampValidBits);
  }
  out->set_memory_bytes(info.DeviceLocalBytes());
  out->set_memory_in_use_bytes(memory_in_use());
  v1::Limits* limits = out->mutable_limits();
  for (int d = 0; d < 3; ++d) {
    limits->add_max_compute_work_group_count(p.limits.maxComputeWorkGroupCount[d]);
    limits->add_max_compute_work_group_size(p.limits.maxComputeWorkGroupSize[d]);
  }
  limits->set_max_compute_work_group_invocations(p.limits.maxComputeWorkGroupInvocations);
  limits->set_max_push_constants_size(p.limits.maxPushConstantsSize);
  limits->set_max_storage_buffer_range(p.limits.maxStorageBufferRange);
  limits->set_max_buffer_size(info.max_buffer_size);
  limits->set_timestamp_period(p.limits.timestampPeriod);
  out->set_properties_raw(reinterpret_cast<const char*>(&p), sizeof(p));
  out->set_sessions(sessions());
}

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(
    const std::vector<uint32_t>& physical_indices, const DevicePoolOptions& options) {
  if (options.metrics == nullptr)
    return absl::InvalidArgumentError("the device pool needs metrics");
  KD_ASSIGN_OR_RETURN(std::vector<core::PhysicalDeviceInfo> all, core::Device::List());
  if (all.empty()) {
    return absl::UnavailableError(
        "no Vulkan device found (is a driver installed? Debian: mesa-vulkan-drivers for lavapipe)");
  }
  std::vector<uint32_t> chosen = physical_indices;
  if (chosen.empty()) {
    for (uint32_t i = 0; i < all.size(); ++i) chosen.push_back(i);
  }
  absl::flat_hash_set<uint32_t> seen;
  for (uint32_t i : chosen) {
    if (i >= all.size()) {
      return absl::InvalidArgumentError(absl::StrCat("device ", i, " does not exist: ", all.size(),
                                                     " Vulkan device(s) present (0..",
                                                     all.size() - 1, ")"));
    }
    if (!seen.insert(i).second) {
      return absl::InvalidArgumentError(absl::StrCat("device ", i, " is listed twice"));
    }
  }
  auto pool = std::unique_ptr<DevicePool>(new DevicePool());
  for (uint32_t i = 0; i < chosen.size(); ++i) {
    KD_ASSIGN_OR_RETURN(auto device, PooledDevice::Open(i, chosen[i], options));
    pool->devices_.push_back(std::move(device));
  }
  return pool;
}

DevicePool::~DevicePool() {
  for (auto& device : devices_) device->waiter_.reset();
}

size_t DevicePool::usable() const {
  size_t n = 0;
  for (const auto& device : devices_) n += device->usable() ? 1 : 0;
  return n;
}

void DevicePool::SetLossListener(std::function<void()> listener) {
  for (auto& device : devices_) device->on_loss_ = listener;
}

absl::StatusOr<PooledDevice*> DevicePool::Get(uint32_t index) const {
  if (index >= devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("device index ", index,
                                                   " out of range: the daemon serves ",
                                                   devices_.size(), " device(s)"));
  }
  return devices_[index].get();
}

}  // namespace komputed::server
