#include "device_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "komputed/core/status.h"
#include "komputed/core/thread_name.h"

namespace komputed::server {
namespace {

// Opens the device and starts the waiter that watches its submissions, polling for up to `spin`
// before it blocks on a GPU.
absl::StatusOr<std::shared_ptr<DeviceInstance>> OpenInstance(const core::DeviceOptions& options,
                                                             absl::Duration spin,
                                                             bool pool_tensor_memory) {
  auto instance = std::make_shared<DeviceInstance>();
  instance->pool_tensor_memory = pool_tensor_memory;
  KD_ASSIGN_OR_RETURN(instance->device, core::Device::Create(options));
  const bool cpu = instance->device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  KD_ASSIGN_OR_RETURN(instance->waiter, core::CompletionWaiter::Create(
                                            instance->device, cpu ? absl::ZeroDuration() : spin));
  return instance;
}

}  // namespace

std::shared_ptr<core::MemoryPool> DeviceInstance::MemoryPoolFor(const std::string& tenant) {
  if (!pool_tensor_memory) return nullptr;
  absl::MutexLock lock(&pools_mu);
  std::shared_ptr<core::MemoryPool>& pool = pools[tenant];
  if (pool == nullptr) pool = core::MemoryPool::Create(device);
  return pool;
}

absl::StatusOr<std::unique_ptr<PooledDevice>> PooledDevice::Open(
    uint32_t pool_index, uint32_t physical_index, const ServerOptions& server_options, Metrics& m) {
  KD_ASSIGN_OR_RETURN(std::vector<core::PhysicalDeviceInfo> all, core::Device::List());
  if (physical_index >= all.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", physical_index, " does not exist: ", all.size(), " Vulkan device(s) present"));
  }
  const core::PhysicalDeviceInfo& info = all[physical_index];
  core::DeviceOptions options;
  options.physical_device_index = physical_index;
  options.calls = server_options.vulkan_calls;
  options.map_device_memory = server_options.map_device_memory;
  options.dispatch_share = server_options.dispatch_share;
  options.invocation_slots = server_options.invocation_slots;
  options.queue_families = info.EveryComputeQueue();
  if (options.queue_families.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", physical_index, " (", info.properties.deviceName, ") has no compute queue"));
  }
  auto pooled = std::unique_ptr<PooledDevice>(new PooledDevice());
  pooled->index_ = pool_index;
  pooled->info_ = info;
  pooled->options_ = options;
  pooled->waiter_spin_ = server_options.eval_spin;
  pooled->pool_tensor_memory_ = server_options.pool_tensor_memory;
  KD_ASSIGN_OR_RETURN(std::shared_ptr<DeviceInstance> instance,
                      OpenInstance(options, pooled->waiter_spin_, pooled->pool_tensor_memory_));
  const core::Device& device = *instance->device;
  for (uint32_t i = 0; i < device.queue_count(); ++i) {
    const core::Queue& q = device.queue(i);
    pooled->queue_index_[{q.family, q.index}] = i;
  }
  {
    absl::MutexLock lock(&pooled->queues_mu_);
    pooled->queue_sessions_.assign(device.queue_count(), 0);
  }
  const std::string label = absl::StrCat(pool_index);
  pooled->memory_used_ = &m.device_memory_used_bytes(label);
  m.device_memory_limit_bytes(label).Set(static_cast<double>(info.DeviceLocalBytes()));
  pooled->losses_ = &m.device_losses_total(label);
  pooled->recoveries_ = &m.device_recoveries_total(label);
  for (uint32_t i = 0; i < device.queue_count(); ++i) {
    const std::string queue = absl::StrCat(i);
    pooled->queue_metrics_.push_back({&m.submissions_total(label, queue),
                                      &m.gpu_execution_seconds_total(label, queue),
                                      &m.queue_depth(label, queue)});
  }
  spdlog::info("device {}: {} (Vulkan device {}), {} queue(s), timeline semaphores: {}", pool_index,
               info.properties.deviceName, physical_index, device.queue_count(),
               device.timeline_supported());
  absl::MutexLock lock(&pooled->mu_);
  pooled->instance_ = std::move(instance);
  return pooled;
}

std::shared_ptr<DeviceInstance> PooledDevice::instance() const {
  absl::MutexLock lock(&mu_);
  return instance_;
}

std::vector<uint32_t> DefaultSessionFamilies(const core::PhysicalDeviceInfo& info) {
  std::vector<uint32_t> compute, compute_only;
  for (uint32_t f = 0; f < info.queue_families.size(); ++f) {
    if (info.HasCompute(f)) compute.push_back(f);
    if (info.HasComputeOnly(f)) compute_only.push_back(f);
  }
  return compute_only.empty() ? compute : compute_only;
}

absl::StatusOr<std::vector<uint32_t>> PooledDevice::AcquireQueues(
    const std::vector<uint32_t>& families) {
  const core::PhysicalDeviceInfo& info = info_;
  absl::MutexLock lock(&queues_mu_);
  // The queues of `family`, least used first (then in the family's order).
  auto by_use = [&](uint32_t family) {
    std::vector<uint32_t> queues;
    for (const auto& [key, index] : queue_index_) {
      if (key.first == family) queues.push_back(index);
    }
    // Called with queues_mu_ held (the analysis does not follow it into a lambda).
    std::sort(
        queues.begin(), queues.end(), [&](uint32_t a, uint32_t b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return std::make_pair(queue_sessions_[a], a) < std::make_pair(queue_sessions_[b], b);
        });
    return queues;
  };
  std::vector<uint32_t> result;
  if (families.empty()) {
    // The least used queue of the compute-only families, or where there are none of every
    // compute-capable family: a kernel on a graphics family's queue keeps the other queues' work
    // waiting even where it leaves compute units free (NVIDIA), one on a compute-only queue does
    // not (core::PhysicalDeviceInfo::HasComputeOnly).
    for (uint32_t f : DefaultSessionFamilies(info)) {
      const std::vector<uint32_t> queues = by_use(f);
      if (!queues.empty() &&
          (result.empty() || std::make_pair(queue_sessions_[queues[0]], queues[0]) <
                                 std::make_pair(queue_sessions_[result[0]], result[0]))) {
        result = {queues[0]};
      }
    }
    if (result.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("device ", index_, " has no compute queue"));
    }
  } else {
    std::map<uint32_t, uint32_t> asked;  // family → queues asked of it
    for (uint32_t family : families) {
      if (family >= info.queue_families.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("queue family ", family, " does not exist on device ", index_,
                         ", which has ", info.queue_families.size(), " queue famil",
                         info.queue_families.size() == 1 ? "y" : "ies"));
      }
      if (!info.HasCompute(family)) {
        return absl::InvalidArgumentError(absl::StrCat("queue family ", family, " of device ",
                                                       index_, " has no compute capability"));
      }
      ++asked[family];
    }
    std::map<uint32_t, std::vector<uint32_t>> chosen;
    for (const auto& [family, count] : asked) {
      std::vector<uint32_t> queues = by_use(family);
      if (count > queues.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            count, " queues requested from queue family ", family, " of device ", index_,
            ", which has ", info.queue_families[family].queueCount, " queue(s)"));
      }
      queues.resize(count);
      // Taken from the back as the request's entries come, so in the order chosen.
      std::reverse(queues.begin(), queues.end());
      chosen[family] = std::move(queues);
    }
    for (uint32_t family : families) {
      result.push_back(chosen[family].back());
      chosen[family].pop_back();
    }
  }
  for (uint32_t q : result) ++queue_sessions_[q];
  return result;
}

void PooledDevice::ReleaseQueues(const std::vector<uint32_t>& queues) {
  absl::MutexLock lock(&queues_mu_);
  for (uint32_t q : queues) {
    if (q < queue_sessions_.size() && queue_sessions_[q] > 0) --queue_sessions_[q];
  }
}

uint32_t PooledDevice::queue_sessions(uint32_t queue) const {
  absl::MutexLock lock(&queues_mu_);
  return queue < queue_sessions_.size() ? queue_sessions_[queue] : 0;
}

void PooledDevice::AddMemory(int64_t bytes) {
  memory_in_use_.fetch_add(bytes, std::memory_order_relaxed);
  memory_used_->Increment(static_cast<double>(bytes));
}

void PooledDevice::Submitted(size_t queue) {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  if (queue >= queue_metrics_.size()) return;
  queue_metrics_[queue].submissions->Increment();
  queue_metrics_[queue].depth->Increment();
}

void PooledDevice::Completed(size_t queue, uint64_t gpu_ns) {
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (queue >= queue_metrics_.size()) return;
  queue_metrics_[queue].depth->Decrement();
  if (gpu_ns > 0) queue_metrics_[queue].gpu_seconds->Increment(static_cast<double>(gpu_ns) * 1e-9);
}

void PooledDevice::CheckLost(const DeviceInstance& instance) {
  if (!instance.device->lost()) return;
  {
    absl::MutexLock lock(&mu_);
    // A loss of an instance already replaced, or one already reported, is not a new loss.
    if (instance_.get() != &instance || loss_reported_) return;
    loss_reported_ = true;
  }
  losses_->Increment();
  spdlog::error(
      "device {} ({}) was lost (VK_ERROR_DEVICE_LOST, or it stopped answering): its sessions' "
      "calls fail with "
      "UNAVAILABLE",
      index_, info_.properties.deviceName);
  if (on_lost_) on_lost_();
}

absl::Status PooledDevice::Recover() {
  std::shared_ptr<DeviceInstance> lost = instance();
  if (!lost->device->lost()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  KD_ASSIGN_OR_RETURN(std::shared_ptr<DeviceInstance> fresh,
                      OpenInstance(options_, waiter_spin_, pool_tensor_memory_));
  {
    absl::MutexLock lock(&mu_);
    retired_.push_back(std::move(instance_));
    instance_ = std::move(fresh);
    loss_reported_ = false;
  }
  recoveries_->Increment();
  spdlog::info("device {} ({}) opened again after its loss, in {}: new sessions can use it", index_,
               info_.properties.deviceName,
               absl::StrFormat("%.3fs", absl::ToDoubleSeconds(absl::Now() - start)));
  return absl::OkStatus();
}

size_t PooledDevice::FreeRetired() {
  std::vector<std::shared_ptr<DeviceInstance>> unused;
  size_t still_held = 0;
  {
    absl::MutexLock lock(&mu_);
    auto held = std::partition(retired_.begin(), retired_.end(),
                               [](const auto& instance) { return instance.use_count() > 1; });
    unused.assign(std::make_move_iterator(held), std::make_move_iterator(retired_.end()));
    retired_.erase(held, retired_.end());
    still_held = retired_.size();
  }
  // Destroyed here, outside the lock: each waiter completes what it still watches.
  if (!unused.empty()) {
    spdlog::debug("device {}: {} lost instance(s) freed", index_, unused.size());
  }
  return still_held;
}

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(const ServerOptions& options,
                                                               Metrics* metrics) {
  if (metrics == nullptr) return absl::InvalidArgumentError("the device pool needs metrics");
  KD_ASSIGN_OR_RETURN(std::vector<core::PhysicalDeviceInfo> all, core::Device::List());
  if (all.empty()) {
    return absl::UnavailableError(
        "no Vulkan device found (is a driver installed? Debian: mesa-vulkan-drivers for lavapipe)");
  }
  std::vector<uint32_t> chosen = options.devices;
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
  pool->recovery_interval_ = options.device_recovery_interval;
  for (uint32_t i = 0; i < chosen.size(); ++i) {
    KD_ASSIGN_OR_RETURN(auto device, PooledDevice::Open(i, chosen[i], options, *metrics));
    DevicePool* const p = pool.get();
    device->on_lost_ = [p] { p->DeviceLost(); };
    pool->devices_.push_back(std::move(device));
  }
  pool->recovery_ = std::thread([p = pool.get()] {
    core::NameThisThread("kd-recovery");
    p->Recovery();
  });
  return pool;
}

DevicePool::~DevicePool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (recovery_.joinable()) recovery_.join();
  // Every waiter first: a waiter's callbacks may use any device. Destroyed outside the devices'
  // locks, which those callbacks take.
  std::vector<std::unique_ptr<core::CompletionWaiter>> waiters;
  for (auto& device : devices_) {
    absl::MutexLock lock(&device->mu_);
    if (device->instance_ != nullptr) waiters.push_back(std::move(device->instance_->waiter));
    for (auto& instance : device->retired_) waiters.push_back(std::move(instance->waiter));
  }
  waiters.clear();
}

void DevicePool::DeviceLost() {
  if (listener_) listener_();
  absl::MutexLock lock(&mu_);
  lost_ = true;
}

void DevicePool::Recovery() {
  const absl::Duration interval = recovery_interval_;
  absl::Time next_attempt = absl::InfiniteFuture();
  int failures = 0;  // attempts in a row that left a device unusable
  while (true) {
    bool retired = false;
    for (auto& device : devices_) retired |= device->FreeRetired() > 0;
    // Wakes for a loss (to schedule an attempt), at the attempt, to look at replaced instances
    // again while sessions hold them, or to stop.
    const absl::Time wake =
        std::min(next_attempt, retired ? absl::Now() + absl::Seconds(1) : absl::InfiniteFuture());
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || lost_; };
      mu_.AwaitWithDeadline(absl::Condition(&woken), wake);
      if (stopping_) return;
      if (lost_) {
        lost_ = false;
        if (interval > absl::ZeroDuration()) {
          next_attempt = std::min(next_attempt, absl::Now() + interval);
        }
        continue;
      }
    }
    if (absl::Now() < next_attempt) continue;
    next_attempt = absl::InfiniteFuture();
    bool recovered = false;
    bool failed = false;
    for (auto& device : devices_) {
      if (device->usable()) continue;
      absl::Status opened = device->Recover();
      if (opened.ok()) {
        recovered = true;
        continue;
      }
      failed = true;
      // A device that stays unusable (fallen off the bus) is tried less and less often.
      const absl::Duration wait = interval * (int64_t{1} << std::min(failures, 6));
      spdlog::warn("device {} could not be opened again after its loss (next try in {}): {}",
                   device->index(), absl::FormatDuration(wait), opened.ToString());
      next_attempt = std::min(next_attempt, absl::Now() + wait);
    }
    failures = failed ? failures + 1 : 0;
    if (recovered && listener_) listener_();
  }
}

bool DevicePool::any_gpu() const {
  for (const auto& device : devices_) {
    if (!device->is_cpu()) return true;
  }
  return false;
}

bool DevicePool::cpu_device_busy() const {
  for (const auto& device : devices_) {
    if (device->is_cpu() && device->in_flight() > 0) return true;
  }
  return false;
}

size_t DevicePool::usable() const {
  size_t n = 0;
  for (const auto& device : devices_) n += device->usable() ? 1 : 0;
  return n;
}

void DevicePool::SetStateListener(std::function<void()> listener) {
  listener_ = std::move(listener);
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
