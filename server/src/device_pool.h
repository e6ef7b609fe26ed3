#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "komputed/core/completion_waiter.h"
#include "komputed/core/device.h"
#include "komputed/v1/komputed.pb.h"

namespace komputed::server {

// One device the daemon serves: a core::Device opened with every queue of every compute-capable
// queue family, the one CompletionWaiter that watches its submissions, and the totals of what
// sessions hold on it. Owned by the DevicePool; lives as long as the pool. Thread-safe.
class PooledDevice {
 public:
  // `pool_index` is the daemon's device index (what OpenSession takes).
  static absl::StatusOr<std::unique_ptr<PooledDevice>> Open(uint32_t pool_index,
                                                            uint32_t physical_index);

  uint32_t index() const { return index_; }
  const std::shared_ptr<core::Device>& device() const { return device_; }
  core::CompletionWaiter& waiter() const { return *waiter_; }

  // The device queue indices for a session that asks for one queue per entry of `families`
  // (repeated entries of a family take its queues 0, 1, 2...; empty: one queue of the first
  // compute-capable family). INVALID_ARGUMENT names the family and its queue count.
  absl::StatusOr<std::vector<uint32_t>> ResolveQueues(const std::vector<uint32_t>& families) const;

  // Tensor memory that sessions hold on this device.
  void AddMemory(int64_t bytes) { memory_in_use_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t memory_in_use() const {
    return static_cast<uint64_t>(memory_in_use_.load(std::memory_order_relaxed));
  }
  // Sessions open on this device.
  void AddSessions(int delta) { sessions_.fetch_add(delta, std::memory_order_relaxed); }
  uint32_t sessions() const {
    return static_cast<uint32_t>(sessions_.load(std::memory_order_relaxed));
  }

  // What ListDevices and OpenSession report about this device.
  void Describe(v1::DeviceInfo* info) const;

 private:
  PooledDevice() = default;

  uint32_t index_ = 0;
  std::shared_ptr<core::Device> device_;
  // Destroyed before the device (declared after it); completes every watched submission first.
  std::unique_ptr<core::CompletionWaiter> waiter_;
  // (queue family, index within the family) → device queue index.
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, uint32_t> queue_index_;
  std::atomic<int64_t> memory_in_use_{0};
  std::atomic<int32_t> sessions_{0};
};

// The devices the daemon serves, indexed 0..size()-1 in the order they were chosen. Immutable
// after Create; thread-safe.
class DevicePool {
 public:
  // Opens every physical device, or those whose physical indices `physical_indices` lists (in
  // that order). INVALID_ARGUMENT for an index that does not exist or is given twice;
  // UNAVAILABLE when there is no Vulkan device at all.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(
      const std::vector<uint32_t>& physical_indices);

  size_t size() const { return devices_.size(); }
  // INVALID_ARGUMENT naming the index and the number of devices.
  absl::StatusOr<PooledDevice*> Get(uint32_t index) const;
  PooledDevice& at(size_t index) const { return *devices_[index]; }

 private:
  std::vector<std::unique_ptr<PooledDevice>> devices_;
};

}  // namespace komputed::server
