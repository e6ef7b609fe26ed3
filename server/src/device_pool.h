#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "komputed/core/completion_waiter.h"
#include "komputed/core/device.h"
#include "komputed/core/memory_pool.h"
#include "metrics.h"
#include "server_options.h"

namespace komputed::server {

// One opening of a physical device: the core::Device with every compute queue, and the one
// CompletionWaiter that watches its submissions. A session keeps the instance that it was opened
// on; when the device is lost, the PooledDevice opens a new instance for new sessions.
struct DeviceInstance {
  std::shared_ptr<core::Device> device;
  // The memory pool (core::MemoryPool) of `tenant`'s small tensors on this opening, made at its
  // first use; null when pool_tensor_memory is off. A tenant's sessions share it; tenants never
  // share one.
  std::shared_ptr<core::MemoryPool> MemoryPoolFor(const std::string& tenant)
      ABSL_LOCKS_EXCLUDED(pools_mu);
  bool pool_tensor_memory = false;
  absl::Mutex pools_mu;
  absl::flat_hash_map<std::string, std::shared_ptr<core::MemoryPool>> pools
      ABSL_GUARDED_BY(pools_mu);
  // Declared last, so destroyed first: it completes every watched submission, whose callbacks
  // use the device (and it holds the device itself).
  std::unique_ptr<core::CompletionWaiter> waiter;
};

// The queue families whose queues serve sessions that ask for none: the compute-only families
// (core::PhysicalDeviceInfo::HasComputeOnly), or every compute-capable one where there are none.
std::vector<uint32_t> DefaultSessionFamilies(const core::PhysicalDeviceInfo& info);

// One device the daemon serves: its current DeviceInstance (a core::Device opened with every queue
// of every compute-capable queue family, and its CompletionWaiter), the totals of what sessions
// hold on it, and its metrics. When the instance is lost, Recover() opens a new one; sessions on
// the old one keep it (their calls fail with UNAVAILABLE) until they close. Owned by the
// DevicePool; lives as long as the pool. Thread-safe.
class PooledDevice {
 public:
  // `pool_index` is the daemon's device index (what OpenSession takes).
  // Opened with options.vulkan_calls; its metrics go to `metrics`.
  static absl::StatusOr<std::unique_ptr<PooledDevice>> Open(uint32_t pool_index,
                                                            uint32_t physical_index,
                                                            const ServerOptions& options,
                                                            Metrics& metrics);

  uint32_t index() const { return index_; }
  // The instance that new sessions open on.
  std::shared_ptr<DeviceInstance> instance() const;

  // The device queue indices for a session that asks for one queue per entry of `families`:
  // distinct queues of each family, those that the fewest sessions use first (empty: the least
  // used queue of the compute-only families, else of any compute-capable family), so that
  // sessions spread over the device's queues
  // and do not wait behind each other's submissions. Counts them as used until ReleaseQueues.
  // INVALID_ARGUMENT names the family and its queue count.
  absl::StatusOr<std::vector<uint32_t>> AcquireQueues(const std::vector<uint32_t>& families);
  void ReleaseQueues(const std::vector<uint32_t>& queues);
  // Sessions that use device queue `queue`.
  uint32_t queue_sessions(uint32_t queue) const;

  // Tensor memory that sessions hold on this device.
  void AddMemory(int64_t bytes);
  uint64_t memory_in_use() const {
    return static_cast<uint64_t>(memory_in_use_.load(std::memory_order_relaxed));
  }
  // Sessions open on this device.
  void AddSessions(int delta) { sessions_.fetch_add(delta, std::memory_order_relaxed); }
  uint32_t sessions() const {
    return static_cast<uint32_t>(sessions_.load(std::memory_order_relaxed));
  }

  // What the device is (ListDevices and OpenSession report it; session_wire.h).
  const core::PhysicalDeviceInfo& info() const { return info_; }
  // Times a lost instance was replaced by a new one.
  uint64_t recoveries() const { return static_cast<uint64_t>(recoveries_->Value()); }

  // Metrics of the device's queues (`queue` is the device queue index): a submission went to
  // the queue; its evaluation completed after `gpu_ns` nanoseconds of GPU time (0: unknown).
  void Submitted(size_t queue);
  void Completed(size_t queue, uint64_t gpu_ns);
  // Submissions made and not yet completed, on all queues.
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

  // Threads waiting inline for a submission (Session::Eval's fast path): Begin admits one while
  // fewer than `limit` are; End follows each admitted Begin.
  bool BeginInlineWait(int limit) {
    int n = inline_waits_.load(std::memory_order_relaxed);
    while (n < limit) {
      if (inline_waits_.compare_exchange_weak(n, n + 1, std::memory_order_acquire)) return true;
    }
    return false;
  }
  void EndInlineWait() { inline_waits_.fetch_sub(1, std::memory_order_release); }

  // Whether the device is a CPU (lavapipe): its work runs on the host's cores.
  bool is_cpu() const { return info_.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; }

  // False while the current instance is lost (VK_ERROR_DEVICE_LOST) and not yet replaced.
  bool usable() const { return !instance()->device->lost(); }
  // Call after an operation on `instance` failed: when it was lost and this is the first to
  // notice, counts and logs the loss and tells the pool (its state listener, its recovery).
  void CheckLost(const DeviceInstance& instance);
  // When the current instance is lost: opens a new one for new sessions. OK when the device was
  // usable or is now; the reason when opening failed.
  absl::Status Recover();
  // Frees the instances replaced by Recover() that no session holds any more; returns the number
  // of replaced instances that sessions still hold.
  size_t FreeRetired();

 private:
  friend class DevicePool;
  PooledDevice() = default;

  // The series of one queue.
  struct QueueMetrics {
    prometheus::Counter* submissions = nullptr;
    prometheus::Counter* gpu_seconds = nullptr;
    prometheus::Gauge* depth = nullptr;
  };

  uint32_t index_ = 0;
  core::PhysicalDeviceInfo info_;
  core::DeviceOptions options_;                        // how each instance is opened
  absl::Duration waiter_spin_ = absl::ZeroDuration();  // its waiter's polling (--eval_spin)
  bool pool_tensor_memory_ = true;                     // --pool_tensor_memory
  // (queue family, index within the family) → device queue index (the same in every instance).
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, uint32_t> queue_index_;
  std::atomic<int64_t> memory_in_use_{0};
  std::atomic<int32_t> sessions_{0};
  std::atomic<int> inline_waits_{0};
  std::atomic<int64_t> in_flight_{0};
  mutable absl::Mutex queues_mu_;
  std::vector<uint32_t> queue_sessions_ ABSL_GUARDED_BY(queues_mu_);  // by device queue index
  std::function<void()> on_lost_;  // set by the pool before any session exists

  prometheus::Gauge* memory_used_ = nullptr;
  prometheus::Counter* losses_ = nullptr;
  prometheus::Counter* recoveries_ = nullptr;
  std::vector<QueueMetrics> queue_metrics_;  // by device queue index

  // Declared last, so destroyed first: the instances' waiters complete every watched
  // submission, whose callbacks use the members above.
  mutable absl::Mutex mu_;
  std::shared_ptr<DeviceInstance> instance_ ABSL_GUARDED_BY(mu_);
  bool loss_reported_ ABSL_GUARDED_BY(mu_) = false;  // for the current instance
  // Lost instances that sessions may still hold; freed once none does.
  std::vector<std::shared_ptr<DeviceInstance>> retired_ ABSL_GUARDED_BY(mu_);
};

// The devices the daemon serves, indexed 0..size()-1 in the order they were chosen. Immutable
// after Create; thread-safe.
class DevicePool {
 public:
  // Opens every physical device, or those whose physical indices options.devices lists (in that
  // order), with options.vulkan_calls; a lost one is opened again after
  // options.device_recovery_interval (backing off while that fails; zero: never). The metrics
  // must outlive the pool. INVALID_ARGUMENT for an index that does not exist or is given twice;
  // UNAVAILABLE when there is no Vulkan device at all.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(const ServerOptions& options,
                                                            Metrics* metrics);

  // Stops the recovery thread, then completes every device's watched submissions (their
  // callbacks may use any device) before it closes the devices.
  ~DevicePool();

  size_t size() const { return devices_.size(); }
  // Devices not lost.
  size_t usable() const;
  // Called each time a device is found lost (on the thread that noticed) and each time a lost
  // device is opened again (on the recovery thread). Set it before any session is opened; not
  // thread-safe against CheckLost.
  void SetStateListener(std::function<void()> listener);
  // INVALID_ARGUMENT naming the index and the number of devices.
  absl::StatusOr<PooledDevice*> Get(uint32_t index) const;
  PooledDevice& at(size_t index) const { return *devices_[index]; }
  // Whether any served device is a GPU (not a CPU implementation such as lavapipe): where one is,
  // threads that wait for the device or for a client's next gRPC call may poll briefly.
  bool any_gpu() const;
  // Whether a CPU device (lavapipe) has submissions in flight: its work then runs on the host's
  // cores, which a polling thread would take from it.
  bool cpu_device_busy() const;

 private:
  DevicePool() = default;
  // The recovery thread: opens lost devices again (recovery_interval_ after a loss, then backing
  // off while that fails) and frees replaced instances once no session holds them.
  void Recovery();
  void DeviceLost();

  absl::Duration recovery_interval_;
  std::function<void()> listener_;
  std::vector<std::unique_ptr<PooledDevice>> devices_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;  // a loss not yet looked at by the recovery thread
  std::thread recovery_;
};

}  // namespace komputed::server
