// komputed_bench: what komputed costs over hand-written Vulkan, measured in one run on one device.
//
//  1. tiny/{raw,core,kp}: one round trip of a tiny sequence (sync 1024 floats to the device,
//     dispatch x*2+1 over them in 16 workgroups of 64, sync back), recorded once and submitted
//     each iteration, through a minimal raw Vulkan path written here, through komputed::core and
//     through kp. Every iteration writes one input value on the host and checks one output value.
//  2. upload_256MiB/{raw,kp}, download_256MiB/{raw,kp}: 256 MiB through a staging buffer, host
//     memcpy included; bytes_per_second.
//  3. saxpy_<N>MiB/kp: y = a*x + y over two vectors of N MiB of floats; bytes_per_second counts
//     3 x 4 bytes per element (x read, y read, y written). opmult_<N>MiB/kp: OpMult's built-in
//     shader, c = a * b over vectors of the same size, counted the same way, and its ratio to
//     saxpy's bytes per second.
//  3b. The cost of clamping shaders' buffer accesses (core::ClampBufferAccesses, which every
//     algorithm gets): tiny/core_unclamped against tiny/core, and saxpy_<N>MiB/core{,_unclamped}
//     (one pair of tensors, an algorithm with and one without the clamping).
//  3c. The cost of the watchdog's cancel checks (core::AddCancelChecks, which the daemon adds to
//     every algorithm): saxpy_<N>MiB/core_stoppable against saxpy_<N>MiB/core, and
//     loop/core_stoppable against loop/core (a kernel bound by a 4096-step loop).
//  3d. The cost of the bound on resident workgroups (core::LoopOverWorkgroups, which the daemon
//     applies with --dispatch_share, default 0.75): saxpy_<N>MiB/core_bounded and
//     loop{,16}/core_bounded against their _stoppable variants.
//
// Remote (remote_bench.cc): komputed daemons serving the same device, each the komputed binary in
// a process of its own as deployed (KOMPUTED_BENCH_INPROCESS_DAEMONS=1: Servers in this process),
// and kp::Managers connected to them over TCP loopback (and a Unix socket for the same-host rows).
// Client and daemons share the host and its cores.
//  4. ping: a bare gRPC round trip (Sessions.Ping), mean latency.
//  5. tcp_loopback: 256 MiB through a plain TCP socket over 127.0.0.1 in 1 MiB writes, into a
//     receiver thread: the ceiling for any protocol on this host (KOMPUTED_BENCH_BULK_ITERS / 2
//     iterations, at least 3).
//  6. tiny_eval/{inprocess,remote}: the tiny sequence's eval() through kp in-process and remote.
//     tiny_eval/interleaved: the in-process, remote and same-host evals and komputed's Ping in
//     turn, each in a run of 16 back to back, so that all share one stretch of the device's
//     clocks and the host's load; the tiny eval's targets are judged on it.
//     tiny_eval/{remote_token,remote_tls}: the remote eval on a daemon that checks a bearer
//     token and on one that serves TLS; tiny_eval/secure_interleaved takes them in turn with the
//     plain one (and the plain daemon's client sending a token it does not check), and their
//     targets are judged on it.
//     tiny_eval/{inprocess_beside_process,same_host_beside_session}: the in-process and the
//     same-host eval while another program (this one, run again with --tiny_eval_loop)
//     evaluates the tiny sequence in a loop, in-process in its own process (a device context of
//     its own) or in a session of its own on the same daemon (one context for both): what two
//     programs sharing a device cost each other on either path (no target; printed as ratios).
//  7. async_evals/{inprocess,remote}: K tiny sequences kept in flight with evalAsync, awaited
//     round robin with evalAwait and submitted again; items_per_second = completed evals.
//     async_copies/{inprocess,remote,same_host}: the same with sequences that only sync up and
//     back, on which the device spends next to no time (the serving path alone).
//     async_evals/interleaved: the in-process, remote and same-host async evals in turn, each
//     16 rounds of its lanes with the pipeline full; the async targets are judged on it.
//     async_evals/stages: the remote async evals through the gRPC API alone (one Execute stream),
//     each eval's time split into stages as tiny_eval/stages does.
//  8. upload_256MiB/remote, download_256MiB/remote: as the kp ones, through the remote Manager.
//     transfers_256MiB/interleaved: tcp_loopback, the remote upload and the remote download in
//     turn, one of each per iteration; the transfer targets are judged on it.
//
// After the run it prints ratios taken from the run's own results: kp/raw and core/raw;
// clamped/unclamped (tiny and saxpy); remote
// tiny eval / (in-process + ping); remote / in-process async evals; remote transfers / TCP
// loopback and / in-process kp.
// --benchmark_out=FILE (with --benchmark_out_format) writes the results as usual; the console
// output is always the console format.
//
// Environment:
//   KOMPUTED_BENCH_MIN_TIME     seconds per tiny and saxpy benchmark (default 1.5)
//   KOMPUTED_BENCH_BULK_ITERS   iterations of each 256 MiB transfer benchmark (default 10)
//   KOMPUTED_BENCH_SAXPY_MB     MiB per saxpy vector (default 64)
//   KOMPUTED_BENCH_DISPATCH_SHARE  the bounded variants' share of the invocation slots (0.75)
//   KOMPUTED_BENCH_DEVICE       physical device index (default: core's default choice)
//   KOMPUTED_BENCH_REMOTE=0     skip the remote benchmarks (4-8)
//   KOMPUTED_BENCH_REMOTE_BULK_ITERS  iterations of each remote 256 MiB transfer (default 3)
//   KOMPUTED_BENCH_ASYNC_DEPTH  sequences in flight in async_evals (default 16: enough to cover
//                               a loopback round trip, as a pipelining client keeps)
//   KOMPUTED_BENCH_EVAL_SPIN_US, KOMPUTED_BENCH_EVAL_INLINE_US, KOMPUTED_BENCH_EVAL_POLL_US,
//   KOMPUTED_BENCH_EVAL_HOLD_US  the benchmark's daemons' --eval_spin, --eval_inline_wait,
//                               --eval_poll and --eval_hold (default: the daemon's)
//   KOMPUTED_BENCH_GRPC_THREADS  the benchmark's daemons' --grpc_threads (default: the daemon's)
//   KOMPUTED_BENCH_MAX_KERNEL_TIME_MS, KOMPUTED_BENCH_DAEMON_DISPATCH_SHARE  the benchmark's
//                               daemons' --max_kernel_time (0: no watchdog) and --dispatch_share
//   KOMPUTED_BENCH_INPROCESS_DAEMONS=1  the daemons and the bare ping servers run in this process
//                               (one profile shows client and daemon) instead of their own
//   KOMPUTED_BINARY             the komputed that the daemons' processes run (default: the build's)
//   KOMPUTED_BENCH_DAEMON=HOST:PORT  a komputed started by hand, serving the same device, that
//                               the TCP benchmarks reach instead of the benchmark's own
//   KOMPUTED_BENCH_STRICT=1     exit with status 1 when a ratio misses its target
//   KOMPUTED_VALIDATION=1       Vulkan validation (core and the raw path share the instance)
#include <benchmark/benchmark.h>
#include <unistd.h>
#include <vulkan/vulkan_core.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <kompute/Kompute.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backend.h"
#include "bench_common.h"
#include "device_pool.h"
#include "eval_stages.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/cancel_check.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/spin.h"
#include "komputed/core/status.h"
#include "komputed/core/tensor.h"
#include "remote/same_host_channel.h"
#include "remote_bench.h"
#include "support/daemon_process.h"

namespace {

namespace core = komputed::core;

using komputed_bench::kBulkBytes;
using komputed_bench::kBulkCount;
using komputed_bench::KpTiny;
using komputed_bench::kTinyBytes;
using komputed_bench::kTinyCount;
using komputed_bench::kTinyLocalSize;
using komputed_bench::MatchesPattern;
using komputed_bench::Pattern;
using komputed_bench::PatternVector;
using komputed_bench::TinyStep;
constexpr uint32_t kSaxpyLocalSize = 256;
constexpr float kSaxpyA = 2.0f;
// The bound on every fence wait of the raw and core paths.
constexpr uint64_t kTimeoutNs = uint64_t{30} * 1000 * 1000 * 1000;

using komputed_bench::kTinyShader;

// Two-dimensional grid (maxComputeWorkGroupCount[0] is 65535 on many devices); the tail is
// guarded by the vector's length.
// Both loop shapes run workgroups of this many invocations.
constexpr uint32_t kLoopLocalSize = 64;
// Each invocation runs a dependent loop of `iterations` steps; nothing is written (the
// condition is never true, but the compiler cannot know).
constexpr char kLoopShader[] = R"(
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
layout(push_constant) uniform Push { uint iterations; } push;
void main() {
  float acc = float(gl_GlobalInvocationID.x);
  for (uint k = 0u; k < push.iterations; ++k) acc = acc * 0.999 + 1.0;
  if (acc == -12345.0) result[0] = acc;
}
)";
constexpr uint32_t kLoopIterations = 4096;
// The same work in 256 iterations of 16 steps: a loop body of a more usual size, over which the
// cancel check's per-iteration instructions are spread.
constexpr char kLoop16Shader[] = R"(
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
layout(push_constant) uniform Push { uint iterations; } push;
#define STEP acc = acc * 0.999 + 1.0;
#define STEP4 STEP STEP STEP STEP
void main() {
  float acc = float(gl_GlobalInvocationID.x);
  for (uint k = 0u; k < push.iterations; ++k) { STEP4 STEP4 STEP4 STEP4 }
  if (acc == -12345.0) result[0] = acc;
}
)";
constexpr uint32_t kLoop16Iterations = kLoopIterations / 16;

constexpr char kSaxpyShader[] = R"(
#version 450
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push { float a; } push;
void main() {
  uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u +
           gl_LocalInvocationID.x;
  if (i < uint(y.length())) y[i] = push.a * x[i] + y[i];
}
)";

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
  double min_time_s = 1.5;
  int64_t bulk_iterations = 10;
  uint64_t saxpy_mb = 64;
  std::optional<uint32_t> device;
  bool strict = false;
  bool remote = true;
  int64_t remote_bulk_iterations = 3;
  uint32_t async_depth = 16;
  std::optional<double> eval_spin_us;           // the daemons' --eval_spin (unset: their default)
  std::optional<double> eval_inline_us;         // the daemons' --eval_inline_wait
  std::optional<double> eval_poll_us;           // the daemons' --eval_poll
  std::optional<double> eval_hold_us;           // the daemons' --eval_hold
  std::optional<int> grpc_threads;              // the daemons' --grpc_threads
  std::string daemon_address;                   // KOMPUTED_BENCH_DAEMON
  bool daemons_in_process = false;              // KOMPUTED_BENCH_INPROCESS_DAEMONS
  std::optional<double> max_kernel_time_ms;     // the daemons' --max_kernel_time
  std::optional<double> daemon_dispatch_share;  // the daemons' --dispatch_share
  // The share of the device's invocation slots that the bounded variants' dispatches may hold
  // (the daemon's --dispatch_share; its default).
  double dispatch_share = 0.75;
};

std::optional<double> EnvNumber(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(d >= 0)) {
    std::cerr << "komputed_bench: ignoring " << name << "=" << value << " (not a number >= 0)\n";
    return std::nullopt;
  }
  return d;
}

Config ReadConfig() {
  Config c;
  if (auto v = EnvNumber("KOMPUTED_BENCH_MIN_TIME"); v && *v > 0) c.min_time_s = *v;
  if (auto v = EnvNumber("KOMPUTED_BENCH_BULK_ITERS"); v && *v >= 1) {
    c.bulk_iterations = static_cast<int64_t>(*v);
  }
  if (auto v = EnvNumber("KOMPUTED_BENCH_SAXPY_MB"); v && *v >= 1) {
    c.saxpy_mb = static_cast<uint64_t>(*v);
  }
  if (auto v = EnvNumber("KOMPUTED_BENCH_DISPATCH_SHARE"); v && *v > 0 && *v <= 1) {
    c.dispatch_share = *v;
  }
  if (auto v = EnvNumber("KOMPUTED_BENCH_DEVICE")) c.device = static_cast<uint32_t>(*v);
  if (auto v = EnvNumber("KOMPUTED_BENCH_STRICT")) c.strict = *v != 0;
  if (auto v = EnvNumber("KOMPUTED_BENCH_REMOTE")) c.remote = *v != 0;
  if (auto v = EnvNumber("KOMPUTED_BENCH_REMOTE_BULK_ITERS"); v && *v >= 1) {
    c.remote_bulk_iterations = static_cast<int64_t>(*v);
  }
  c.eval_spin_us = EnvNumber("KOMPUTED_BENCH_EVAL_SPIN_US");
  c.max_kernel_time_ms = EnvNumber("KOMPUTED_BENCH_MAX_KERNEL_TIME_MS");
  c.daemon_dispatch_share = EnvNumber("KOMPUTED_BENCH_DAEMON_DISPATCH_SHARE");
  c.eval_inline_us = EnvNumber("KOMPUTED_BENCH_EVAL_INLINE_US");
  c.eval_poll_us = EnvNumber("KOMPUTED_BENCH_EVAL_POLL_US");
  c.eval_hold_us = EnvNumber("KOMPUTED_BENCH_EVAL_HOLD_US");
  if (auto v = EnvNumber("KOMPUTED_BENCH_GRPC_THREADS"); v && *v >= 1 && *v <= 64) {
    c.grpc_threads = static_cast<int>(*v);
  }
  if (const char* v = std::getenv("KOMPUTED_BENCH_DAEMON"); v != nullptr) c.daemon_address = v;
  if (auto v = EnvNumber("KOMPUTED_BENCH_INPROCESS_DAEMONS")) c.daemons_in_process = *v != 0;
  if (auto v = EnvNumber("KOMPUTED_BENCH_ASYNC_DEPTH"); v && *v >= 1) {
    c.async_depth = static_cast<uint32_t>(*v);
  }
  return c;
}

std::string VkError(VkResult r, const char* what) {
  return std::string(core::VkStatus(r, what).message());
}

// ---------------------------------------------------------------------------------------------
// The raw path: a minimal hand-written Vulkan program, the baseline that core and kp are
// compared with. Nothing here goes through komputed, except that the VkInstance and the choice
// of physical device are core's (so that all three paths run on the same device).

// One buffer and its memory, mapped when host-visible. Plain data: RawVulkan destroys it.
struct RawBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  VkDeviceSize size = 0;
};

// A VkDevice with one queue, a command pool and a fence. Single-threaded.
class RawVulkan {
 public:
  RawVulkan() = default;
  RawVulkan(const RawVulkan&) = delete;
  RawVulkan& operator=(const RawVulkan&) = delete;
  ~RawVulkan() { Close(); }

  absl::Status Open(VkPhysicalDevice physical, uint32_t family) {
    physical_ = physical;
    vkGetPhysicalDeviceMemoryProperties(physical, &memory_);
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    KD_VK_RETURN_IF_ERROR(vkCreateDevice(physical, &di, nullptr, &device_), "vkCreateDevice");
    vkGetDeviceQueue(device_, family, 0, &queue_);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = family;
    KD_VK_RETURN_IF_ERROR(vkCreateCommandPool(device_, &pi, nullptr, &pool_),
                          "vkCreateCommandPool");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    KD_VK_RETURN_IF_ERROR(vkCreateFence(device_, &fi, nullptr, &fence_), "vkCreateFence");
    return absl::OkStatus();
  }

  // Destroys what Open made, in reverse order. Everything made from the device must be gone.
  void Close() {
    if (device_ == VK_NULL_HANDLE) return;
    vkDeviceWaitIdle(device_);
    if (fence_ != VK_NULL_HANDLE) vkDestroyFence(device_, fence_, nullptr);
    if (pool_ != VK_NULL_HANDLE) vkDestroyCommandPool(device_, pool_, nullptr);
    vkDestroyDevice(device_, nullptr);
    fence_ = VK_NULL_HANDLE;
    pool_ = VK_NULL_HANDLE;
    queue_ = VK_NULL_HANDLE;
    device_ = VK_NULL_HANDLE;
  }

  VkDevice device() const { return device_; }

  // Same choice as core: a type with all of `required`, preferring one that also has `preferred`.
  std::optional<uint32_t> FindMemoryType(uint32_t bits, VkMemoryPropertyFlags required,
                                         VkMemoryPropertyFlags preferred) const {
    std::optional<uint32_t> fallback;
    for (uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
      if ((bits & (1u << i)) == 0) continue;
      const VkMemoryPropertyFlags flags = memory_.memoryTypes[i].propertyFlags;
      if ((flags & required) != required) continue;
      if ((flags & preferred) == preferred) return i;
      if (!fallback) fallback = i;
    }
    return fallback;
  }

  // On error nothing is left allocated.
  absl::StatusOr<RawBuffer> CreateBuffer(VkDeviceSize size, VkBufferUsageFlags usage,
                                         VkMemoryPropertyFlags required,
                                         VkMemoryPropertyFlags preferred) {
    RawBuffer b;
    b.size = size;
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = size;
    bi.usage = usage;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    KD_VK_RETURN_IF_ERROR(vkCreateBuffer(device_, &bi, nullptr, &b.buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device_, b.buffer, &req);
    std::optional<uint32_t> type = FindMemoryType(req.memoryTypeBits, required, preferred);
    if (!type) {
      DestroyBuffer(b);
      return absl::NotFoundError("raw path: no suitable memory type");
    }
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = *type;
    VkResult r = vkAllocateMemory(device_, &ai, nullptr, &b.memory);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(device_, b.buffer, b.memory, 0);
    if (r == VK_SUCCESS &&
        (memory_.memoryTypes[*type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) {
      r = vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped);
    }
    if (r != VK_SUCCESS) {
      DestroyBuffer(b);
      return core::VkStatus(r, "raw path: buffer memory");
    }
    return b;
  }

  // Reverse order: unmap, buffer, memory.
  void DestroyBuffer(RawBuffer& b) {
    if (b.mapped != nullptr) vkUnmapMemory(device_, b.memory);
    if (b.buffer != VK_NULL_HANDLE) vkDestroyBuffer(device_, b.buffer, nullptr);
    if (b.memory != VK_NULL_HANDLE) vkFreeMemory(device_, b.memory, nullptr);
    b = RawBuffer{};
  }

  absl::StatusOr<VkCommandBuffer> AllocateCommandBuffer() {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    KD_VK_RETURN_IF_ERROR(vkAllocateCommandBuffers(device_, &ai, &cb), "vkAllocateCommandBuffers");
    return cb;
  }

  void FreeCommandBuffer(VkCommandBuffer& cb) {
    if (cb != VK_NULL_HANDLE) vkFreeCommandBuffers(device_, pool_, 1, &cb);
    cb = VK_NULL_HANDLE;
  }

  // The per-iteration work: vkResetFences + vkQueueSubmit + vkWaitForFences (bounded); with
  // `spin`, the fence is polled (vkGetFenceStatus, a CPU pause between polls) for up to that long
  // before the wait sleeps, as the daemon does (--eval_spin): the floor of a short wait.
  VkResult Run(VkCommandBuffer cb, uint64_t timeout_ns,
               absl::Duration spin = absl::ZeroDuration()) {
    VkResult r = vkResetFences(device_, 1, &fence_);
    if (r != VK_SUCCESS) return r;
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    r = vkQueueSubmit(queue_, 1, &si, fence_);
    if (r != VK_SUCCESS) return r;
    if (spin > absl::ZeroDuration()) {
      const absl::Time until = absl::Now() + spin;
      while (vkGetFenceStatus(device_, fence_) == VK_NOT_READY && absl::Now() < until) {
        komputed::core::CpuRelax();
      }
    }
    return vkWaitForFences(device_, 1, &fence_, VK_TRUE, timeout_ns);
  }

 private:
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;  // owned by the device
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
};

void RawBarrier(VkCommandBuffer cb, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
                VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
  VkMemoryBarrier b{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, &b, 0, nullptr, 0, nullptr);
}

void RawCopy(VkCommandBuffer cb, VkBuffer src, VkBuffer dst, VkDeviceSize size) {
  VkBufferCopy region{0, 0, size};
  vkCmdCopyBuffer(cb, src, dst, 1, &region);
}

constexpr VkBufferUsageFlags kDeviceUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                            VK_BUFFER_USAGE_TRANSFER_DST_BIT;
constexpr VkBufferUsageFlags kStagingUsage =
    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
constexpr VkMemoryPropertyFlags kHostVisible =
    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;

// A device-local buffer with its host-visible staging buffer (the memory choice core makes for a
// kDevice tensor).
absl::Status CreateBufferPair(RawVulkan& vk, VkDeviceSize size, RawBuffer* device,
                              RawBuffer* staging) {
  KD_ASSIGN_OR_RETURN(*device,
                      vk.CreateBuffer(size, kDeviceUsage, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0));
  KD_ASSIGN_OR_RETURN(*staging, vk.CreateBuffer(size, kStagingUsage, kHostVisible,
                                                VK_MEMORY_PROPERTY_HOST_CACHED_BIT));
  std::memset(staging->mapped, 0, size);
  return absl::OkStatus();
}

// The tiny sequence, raw: buffers, descriptor set, pipeline and one command buffer recorded once.
class RawTiny {
 public:
  explicit RawTiny(RawVulkan* vk) : vk_(vk) {}
  RawTiny(const RawTiny&) = delete;
  RawTiny& operator=(const RawTiny&) = delete;
  ~RawTiny() { Destroy(); }

  absl::Status Create(const std::vector<uint32_t>& spirv) {
    VkDevice dev = vk_->device();
    KD_RETURN_IF_ERROR(CreateBufferPair(*vk_, kTinyBytes, &device_, &staging_));

    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = spirv.size() * sizeof(uint32_t);
    mi.pCode = spirv.data();
    KD_VK_RETURN_IF_ERROR(vkCreateShaderModule(dev, &mi, nullptr, &module_),
                          "vkCreateShaderModule");

    VkDescriptorSetLayoutBinding binding{0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                         VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    li.bindingCount = 1;
    li.pBindings = &binding;
    KD_VK_RETURN_IF_ERROR(vkCreateDescriptorSetLayout(dev, &li, nullptr, &set_layout_),
                          "vkCreateDescriptorSetLayout");

    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = 1;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    KD_VK_RETURN_IF_ERROR(vkCreateDescriptorPool(dev, &pi, nullptr, &descriptor_pool_),
                          "vkCreateDescriptorPool");
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = descriptor_pool_;
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &set_layout_;
    KD_VK_RETURN_IF_ERROR(vkAllocateDescriptorSets(dev, &ai, &set_), "vkAllocateDescriptorSets");
    VkDescriptorBufferInfo info{device_.buffer, 0, VK_WHOLE_SIZE};
    VkWriteDescriptorSet write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    write.dstSet = set_;
    write.dstBinding = 0;
    write.descriptorCount = 1;
    write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    write.pBufferInfo = &info;
    vkUpdateDescriptorSets(dev, 1, &write, 0, nullptr);

    VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &set_layout_;
    KD_VK_RETURN_IF_ERROR(vkCreatePipelineLayout(dev, &pli, nullptr, &layout_),
                          "vkCreatePipelineLayout");
    VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = module_;
    ci.stage.pName = "main";
    ci.layout = layout_;
    KD_VK_RETURN_IF_ERROR(
        vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &pipeline_),
        "vkCreateComputePipelines");

    // Recorded once: staging → device, x*2+1, device → staging, visible to the host.
    KD_ASSIGN_OR_RETURN(cb_, vk_->AllocateCommandBuffer());
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    KD_VK_RETURN_IF_ERROR(vkBeginCommandBuffer(cb_, &bi), "vkBeginCommandBuffer");
    RawCopy(cb_, staging_.buffer, device_.buffer, kTinyBytes);
    RawBarrier(cb_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
               VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_);
    vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &set_, 0, nullptr);
    vkCmdDispatch(cb_, kTinyCount / kTinyLocalSize, 1, 1);
    RawBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    RawCopy(cb_, device_.buffer, staging_.buffer, kTinyBytes);
    RawBarrier(cb_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
               VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    KD_VK_RETURN_IF_ERROR(vkEndCommandBuffer(cb_), "vkEndCommandBuffer");
    return absl::OkStatus();
  }

  // Reverse order of creation. Safe on a partly created object.
  void Destroy() {
    VkDevice dev = vk_->device();
    if (dev == VK_NULL_HANDLE) return;
    vkDeviceWaitIdle(dev);
    vk_->FreeCommandBuffer(cb_);
    if (pipeline_ != VK_NULL_HANDLE) vkDestroyPipeline(dev, pipeline_, nullptr);
    if (layout_ != VK_NULL_HANDLE) vkDestroyPipelineLayout(dev, layout_, nullptr);
    // Destroying the pool frees set_.
    if (descriptor_pool_ != VK_NULL_HANDLE) vkDestroyDescriptorPool(dev, descriptor_pool_, nullptr);
    if (set_layout_ != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(dev, set_layout_, nullptr);
    if (module_ != VK_NULL_HANDLE) vkDestroyShaderModule(dev, module_, nullptr);
    vk_->DestroyBuffer(staging_);
    vk_->DestroyBuffer(device_);
    pipeline_ = VK_NULL_HANDLE;
    layout_ = VK_NULL_HANDLE;
    set_ = VK_NULL_HANDLE;
    descriptor_pool_ = VK_NULL_HANDLE;
    set_layout_ = VK_NULL_HANDLE;
    module_ = VK_NULL_HANDLE;
  }

  float* host() const { return static_cast<float*>(staging_.mapped); }
  VkCommandBuffer command_buffer() const { return cb_; }

 private:
  RawVulkan* vk_;
  RawBuffer device_;
  RawBuffer staging_;
  VkShaderModule module_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkDescriptorPool descriptor_pool_ = VK_NULL_HANDLE;
  VkDescriptorSet set_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkPipeline pipeline_ = VK_NULL_HANDLE;
  VkCommandBuffer cb_ = VK_NULL_HANDLE;
};

// 256 MiB raw: a device buffer, its staging buffer, an upload and a download command buffer.
class RawBulk {
 public:
  explicit RawBulk(RawVulkan* vk) : vk_(vk) {}
  RawBulk(const RawBulk&) = delete;
  RawBulk& operator=(const RawBulk&) = delete;
  ~RawBulk() { Destroy(); }

  absl::Status Create(VkDeviceSize size) {
    KD_RETURN_IF_ERROR(CreateBufferPair(*vk_, size, &device_, &staging_));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    KD_ASSIGN_OR_RETURN(upload_, vk_->AllocateCommandBuffer());
    KD_VK_RETURN_IF_ERROR(vkBeginCommandBuffer(upload_, &bi), "vkBeginCommandBuffer");
    RawCopy(upload_, staging_.buffer, device_.buffer, size);
    KD_VK_RETURN_IF_ERROR(vkEndCommandBuffer(upload_), "vkEndCommandBuffer");
    KD_ASSIGN_OR_RETURN(download_, vk_->AllocateCommandBuffer());
    KD_VK_RETURN_IF_ERROR(vkBeginCommandBuffer(download_, &bi), "vkBeginCommandBuffer");
    RawCopy(download_, device_.buffer, staging_.buffer, size);
    RawBarrier(download_, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
               VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    KD_VK_RETURN_IF_ERROR(vkEndCommandBuffer(download_), "vkEndCommandBuffer");
    // Fault in the device buffer, as core does when it fills a new tensor.
    VkResult r = vk_->Run(upload_, kTimeoutNs);
    if (r != VK_SUCCESS) return core::VkStatus(r, "raw upload");
    return absl::OkStatus();
  }

  void Destroy() {
    if (vk_->device() == VK_NULL_HANDLE) return;
    vkDeviceWaitIdle(vk_->device());
    vk_->FreeCommandBuffer(download_);
    vk_->FreeCommandBuffer(upload_);
    vk_->DestroyBuffer(staging_);
    vk_->DestroyBuffer(device_);
  }

  void* host() const { return staging_.mapped; }
  VkCommandBuffer upload() const { return upload_; }
  VkCommandBuffer download() const { return download_; }

 private:
  RawVulkan* vk_;
  RawBuffer device_;
  RawBuffer staging_;
  VkCommandBuffer upload_ = VK_NULL_HANDLE;
  VkCommandBuffer download_ = VK_NULL_HANDLE;
};

// ---------------------------------------------------------------------------------------------
// The core and kp contexts

struct CoreTiny {
  std::shared_ptr<core::Tensor> tensor;
  std::shared_ptr<core::Algorithm> algorithm;
  std::unique_ptr<core::Sequence> sequence;
};

// saxpy through core over one pair of tensors: [0] clamped (as every algorithm is), [1] not.
struct CoreSaxpy {
  uint64_t count = 0;
  std::shared_ptr<core::Tensor> x;
  std::shared_ptr<core::Tensor> y;
  // [kClamped] as every algorithm is in-process, [kUnclamped] without the clamping,
  // [kStoppable] clamped and with the watchdog's cancel checks, as the daemon runs every algorithm.
  // [kBounded] also with at most the daemon's default --dispatch_share of the device's invocation
  // slots held at a time (the same as kStoppable on a device that does not report them).
  std::shared_ptr<core::Algorithm> algorithm[4];
  std::unique_ptr<core::Sequence> sequence[4];  // one dispatch each, recorded once
  uint64_t dispatches = 0;                      // so far, by all
};
enum SaxpyVariant { kClamped = 0, kUnclamped = 1, kStoppable = 2, kBounded = 3 };

// The loop-bound kernels (kLoopShader, kLoop16Shader: [shape]), plain, with the watchdog's
// cancel checks, and with those and the daemon's bound on resident workgroups ([variant]).
struct CoreLoop {
  std::shared_ptr<core::Tensor> out;
  std::shared_ptr<core::Algorithm> algorithm[2][3];
  std::unique_ptr<core::Sequence> sequence[2][3];
};
enum LoopVariant { kLoopPlain = 0, kLoopStoppable = 1, kLoopBounded = 2 };

// OpMult (its built-in shader) over three tensors of the saxpy vectors' size.
struct KpMult {
  uint64_t count = 0;
  std::shared_ptr<kp::TensorT<float>> a, b, c;
  std::shared_ptr<kp::Sequence> sequence;  // the OpMult, recorded once
};

struct KpSaxpy {
  uint64_t count = 0;
  std::shared_ptr<kp::TensorT<float>> x;
  std::shared_ptr<kp::TensorT<float>> y;
  std::shared_ptr<kp::Algorithm> algorithm;
  std::shared_ptr<kp::Sequence> sequence;  // one dispatch, recorded once
  uint64_t dispatches = 0;                 // so far, over every run of the benchmark
};

// Everything the benchmarks share. Members are destroyed bottom-up; Teardown() does it explicitly.
struct Env {
  Config config;
  std::vector<uint32_t> tiny_spirv;
  std::vector<uint32_t> saxpy_spirv;
  std::shared_ptr<core::Device> core_device;  // its physical device is the one for all paths
  std::string device_name;
  RawVulkan raw;
  std::unique_ptr<RawTiny> raw_tiny;
  CoreTiny core_tiny;
  CoreTiny core_tiny_unclamped;
  std::unique_ptr<CoreSaxpy> core_saxpy;  // made by the first run of either
  std::unique_ptr<CoreLoop> core_loop;    // made by the first run of either
  std::unique_ptr<kp::Manager> mgr;
  KpTiny kp_tiny;
  std::unique_ptr<KpSaxpy> saxpy;                       // made by its first run
  std::unique_ptr<KpMult> mult;                         // made by its first run
  std::unique_ptr<komputed_bench::RemoteBench> remote;  // uses mgr

  void Teardown() {
    remote.reset();
    saxpy.reset();
    mult.reset();
    kp_tiny = KpTiny{};
    mgr.reset();
    core_saxpy.reset();
    core_loop.reset();
    for (CoreTiny* t : {&core_tiny, &core_tiny_unclamped}) {
      t->sequence.reset();
      t->algorithm.reset();
      t->tensor.reset();
    }
    core_device.reset();
    raw_tiny.reset();
    raw.Close();
  }
};

Env* g_env = nullptr;

// The queue family that an in-process kp::Manager uses by default (core::Device::Create without
// families).
uint32_t KpDefaultFamily(const core::PhysicalDeviceInfo& info) {
  return info.FirstComputeFamily().value_or(0);
}

// The tiny sequence through core, its shader clamped or not.
absl::Status MakeCoreTiny(Env& env, bool clamp, CoreTiny* tiny) {
  KD_ASSIGN_OR_RETURN(tiny->tensor,
                      core::Tensor::Create(env.core_device, core::ElementType::kFloat32, kTinyCount,
                                           0, core::MemoryType::kDevice, nullptr));
  core::AlgorithmSpec spec;
  spec.tensors = {tiny->tensor};
  spec.spirv = env.tiny_spirv;
  spec.workgroup = {kTinyCount / kTinyLocalSize, 1, 1};
  spec.clamp_buffer_accesses = clamp;
  KD_ASSIGN_OR_RETURN(tiny->algorithm, core::Algorithm::Create(env.core_device, std::move(spec)));
  KD_ASSIGN_OR_RETURN(tiny->sequence, core::Sequence::Create(env.core_device, 0, 0));
  core::Sequence& seq = *tiny->sequence;
  KD_RETURN_IF_ERROR(seq.Record(core::op::SyncToDevice{{tiny->tensor}}));
  KD_RETURN_IF_ERROR(seq.Record(core::op::Dispatch{tiny->algorithm, std::nullopt}));
  return seq.Record(core::op::SyncToHost{{tiny->tensor}});
}

absl::Status SetUp(Env& env) {
  KD_ASSIGN_OR_RETURN(env.tiny_spirv, core::CompileGlsl(kTinyShader, "tiny.comp"));
  KD_ASSIGN_OR_RETURN(env.saxpy_spirv, core::CompileGlsl(kSaxpyShader, "saxpy.comp"));

  // core: its default device choice (or KOMPUTED_BENCH_DEVICE) decides the device for all.
  core::DeviceOptions options;
  options.physical_device_index = env.config.device;
  KD_ASSIGN_OR_RETURN(env.core_device, core::Device::Create(options));
  const core::Device& device = *env.core_device;
  env.device_name = device.properties().deviceName;
  KD_RETURN_IF_ERROR(MakeCoreTiny(env, /*clamp=*/true, &env.core_tiny));
  KD_RETURN_IF_ERROR(MakeCoreTiny(env, /*clamp=*/false, &env.core_tiny_unclamped));

  // raw: its own VkDevice on the same physical device and queue family as core's queue 0.
  KD_RETURN_IF_ERROR(env.raw.Open(device.physical_device(), device.queue(0).family));
  env.raw_tiny = std::make_unique<RawTiny>(&env.raw);
  KD_RETURN_IF_ERROR(env.raw_tiny->Create(env.tiny_spirv));

  // kp: a Manager on the same physical device index.
  try {
    env.mgr = std::make_unique<kp::Manager>(device.info().index);
    const std::string kp_name = env.mgr->getDeviceProperties().deviceName.data();
    if (kp_name != env.device_name) {
      return absl::InternalError(
          absl::StrCat("kp chose device \"", kp_name, "\", core chose \"", env.device_name, "\""));
    }
    env.kp_tiny = komputed_bench::MakeKpTiny(*env.mgr, env.tiny_spirv);
  } catch (const kp::Error& e) {
    return absl::Status(static_cast<absl::StatusCode>(e.code()), e.what());
  }

  // remote: daemons on the same physical device, and Managers connected to them.
  if (env.config.remote) {
    komputed_bench::RemoteConfig rc;
    rc.physical_device = device.info().index;
    rc.tiny_spirv = env.tiny_spirv;
    rc.min_time_s = env.config.min_time_s;
    rc.tcp_iterations = std::max<int64_t>(3, env.config.bulk_iterations / 2);
    rc.bulk_iterations = env.config.remote_bulk_iterations;
    rc.same_host_bulk_iterations = env.config.bulk_iterations;
    rc.async_depth = env.config.async_depth;
    if (env.config.eval_spin_us.has_value()) {
      rc.eval_spin = absl::Microseconds(*env.config.eval_spin_us);
    }
    if (env.config.eval_inline_us.has_value()) {
      rc.eval_inline_wait = absl::Microseconds(*env.config.eval_inline_us);
    }
    if (env.config.eval_poll_us.has_value()) {
      rc.eval_poll = absl::Microseconds(*env.config.eval_poll_us);
    }
    if (env.config.eval_hold_us.has_value()) {
      rc.eval_hold = absl::Microseconds(*env.config.eval_hold_us);
    }
    rc.grpc_threads = env.config.grpc_threads;
    rc.daemon_address = env.config.daemon_address;
    rc.daemons_in_process = env.config.daemons_in_process;
    if (env.config.max_kernel_time_ms.has_value()) {
      rc.max_kernel_time = absl::Milliseconds(*env.config.max_kernel_time_ms);
    }
    rc.dispatch_share = env.config.daemon_dispatch_share;
    rc.gib_transfers = device.properties().deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    rc.client_spin = kp::internal::WaitSpin(device.properties().deviceType);
    rc.kp_family = KpDefaultFamily(device.info());
    rc.session_family = komputed::server::DefaultSessionFamilies(device.info()).front();
    KD_ASSIGN_OR_RETURN(env.remote,
                        komputed_bench::RemoteBench::Start(std::move(rc), env.mgr.get()));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The benchmarks

void RunRawTiny(benchmark::State& state, absl::Duration spin) {
  RawVulkan& vk = g_env->raw;
  float* data = g_env->raw_tiny->host();
  const VkCommandBuffer cb = g_env->raw_tiny->command_buffer();
  uint64_t i = 0;
  for (auto _ : state) {
    const TinyStep step(i++);
    data[step.k] = step.v;
    const VkResult r = vk.Run(cb, kTimeoutNs, spin);
    if (r != VK_SUCCESS) {
      state.SkipWithError(VkError(r, "raw submit/wait").c_str());
      break;
    }
    if (data[step.k] != step.expected()) {
      state.SkipWithError("raw: wrong result");
      break;
    }
  }
}

void BM_TinyRaw(benchmark::State& state) { RunRawTiny(state, absl::ZeroDuration()); }
// The daemon's default --eval_spin poll before the sleep.
void BM_TinyRawSpin(benchmark::State& state) { RunRawTiny(state, absl::Microseconds(50)); }

void RunCoreTiny(benchmark::State& state, CoreTiny& tiny) {
  core::Sequence& seq = *tiny.sequence;
  float* data = static_cast<float*>(tiny.tensor->host_data());
  const absl::Duration timeout = absl::Nanoseconds(static_cast<int64_t>(kTimeoutNs));
  uint64_t i = 0;
  for (auto _ : state) {
    const TinyStep step(i++);
    data[step.k] = step.v;
    const absl::Status s = seq.Eval(timeout);
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    if (data[step.k] != step.expected()) {
      state.SkipWithError("core: wrong result");
      break;
    }
  }
}

void BM_TinyCore(benchmark::State& state) { RunCoreTiny(state, g_env->core_tiny); }
void BM_TinyCoreUnclamped(benchmark::State& state) {
  RunCoreTiny(state, g_env->core_tiny_unclamped);
}

void BM_TinyKp(benchmark::State& state) { komputed_bench::RunKpTiny(state, g_env->kp_tiny, "kp"); }

void BM_UploadRaw(benchmark::State& state) {
  RawVulkan& vk = g_env->raw;
  RawBulk bulk(&vk);
  if (absl::Status s = bulk.Create(kBulkBytes); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const std::vector<float> src = PatternVector(kBulkCount);
  for (auto _ : state) {
    std::memcpy(bulk.host(), src.data(), kBulkBytes);
    const VkResult r = vk.Run(bulk.upload(), kTimeoutNs);
    if (r != VK_SUCCESS) {
      state.SkipWithError(VkError(r, "raw upload").c_str());
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBulkBytes));
  // Untimed: the data must be on the device.
  std::memset(bulk.host(), 0, kBulkBytes);
  const VkResult r = vk.Run(bulk.download(), kTimeoutNs);
  if (r != VK_SUCCESS || !MatchesPattern(static_cast<const float*>(bulk.host()), kBulkCount)) {
    state.SkipWithError("raw upload: the device does not hold the uploaded data");
  }
}

void BM_DownloadRaw(benchmark::State& state) {
  RawVulkan& vk = g_env->raw;
  RawBulk bulk(&vk);
  if (absl::Status s = bulk.Create(kBulkBytes); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  {
    const std::vector<float> src = PatternVector(kBulkCount);
    std::memcpy(bulk.host(), src.data(), kBulkBytes);
    const VkResult r = vk.Run(bulk.upload(), kTimeoutNs);
    if (r != VK_SUCCESS) {
      state.SkipWithError(VkError(r, "raw upload").c_str());
      return;
    }
    std::memset(bulk.host(), 0, kBulkBytes);
  }
  std::vector<float> dst(kBulkCount);
  uint64_t i = 0;
  for (auto _ : state) {
    const VkResult r = vk.Run(bulk.download(), kTimeoutNs);
    if (r != VK_SUCCESS) {
      state.SkipWithError(VkError(r, "raw download").c_str());
      return;
    }
    std::memcpy(dst.data(), bulk.host(), kBulkBytes);
    const uint64_t k = (i++ * 7919) % kBulkCount;
    if (dst[k] != Pattern(k)) {
      state.SkipWithError("raw download: wrong data");
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kBulkBytes));
}

void BM_UploadKp(benchmark::State& state) {
  komputed_bench::RunKpUpload(state, *g_env->mgr, "kp upload");
}

void BM_DownloadKp(benchmark::State& state) {
  komputed_bench::RunKpDownload(state, *g_env->mgr, "kp download");
}

void BM_UploadGiBKp(benchmark::State& state) {
  komputed_bench::RunKpUpload(state, *g_env->mgr, "kp upload", komputed_bench::kGiBBytes);
}

void BM_DownloadGiBKp(benchmark::State& state) {
  komputed_bench::RunKpDownload(state, *g_env->mgr, "kp download", komputed_bench::kGiBBytes);
}

// Workgroups for `count` elements: a 2-D grid that stays within 65535 per dimension.
kp::Workgroup SaxpyWorkgroup(uint64_t count) {
  const uint64_t groups = (count + kSaxpyLocalSize - 1) / kSaxpyLocalSize;
  const uint64_t y = (groups + 65534) / 65535;
  const uint64_t x = (groups + y - 1) / y;
  return {static_cast<uint32_t>(x), static_cast<uint32_t>(y), 1};
}

void BM_SaxpyKp(benchmark::State& state) {
  kp::Manager& mgr = *g_env->mgr;
  try {
    if (g_env->saxpy == nullptr) {
      auto s = std::make_unique<KpSaxpy>();
      s->count = g_env->config.saxpy_mb * (uint64_t{1} << 20) / sizeof(float);
      s->x = mgr.tensor(std::vector<float>(s->count, 1.0f));
      s->y = mgr.tensorT<float>(s->count);
      const std::vector<std::shared_ptr<kp::Tensor>> params = {s->x, s->y};
      s->algorithm = mgr.algorithm(params, g_env->saxpy_spirv, SaxpyWorkgroup(s->count),
                                   std::vector<float>{}, std::vector<float>{kSaxpyA});
      s->sequence = mgr.sequence();
      s->sequence->record<kp::OpAlgoDispatch>(s->algorithm);
      g_env->saxpy = std::move(s);
    }
    KpSaxpy& s = *g_env->saxpy;
    for (auto _ : state) {
      s.sequence->eval();
      ++s.dispatches;
    }
    const int64_t bytes = static_cast<int64_t>(3 * s.count * sizeof(float));
    state.SetBytesProcessed(state.iterations() * bytes);
    // Untimed: y = a * 1 * dispatches everywhere (exact while below 2^24).
    mgr.sequence()->eval<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{s.y});
    const float expected = kSaxpyA * static_cast<float>(s.dispatches);
    const float* y = s.y->data();
    if (y[0] != expected || y[s.count / 2] != expected || y[s.count - 1] != expected) {
      state.SkipWithError(
          absl::StrCat("saxpy: wrong result: y[last] = ", y[s.count - 1], ", expected ", expected)
              .c_str());
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(e.what());
  }
}

// c = a * b by OpMult over the saxpy vectors' size: its bytes per second (3 x 4 bytes per
// element) against saxpy's.
void BM_MultKp(benchmark::State& state) {
  kp::Manager& mgr = *g_env->mgr;
  try {
    if (g_env->mult == nullptr) {
      auto m = std::make_unique<KpMult>();
      m->count = g_env->config.saxpy_mb * (uint64_t{1} << 20) / sizeof(float);
      m->a = mgr.tensor(std::vector<float>(m->count, 1.5f));
      m->b = mgr.tensor(std::vector<float>(m->count, 2.0f));
      m->c = mgr.tensorT<float>(m->count);
      m->sequence = mgr.sequence();
      m->sequence->record<kp::OpMult>({m->a, m->b, m->c}, mgr.algorithm());
      g_env->mult = std::move(m);
    }
    KpMult& m = *g_env->mult;
    for (auto _ : state) m.sequence->eval();
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(3 * m.count * sizeof(float)));
    // Untimed: every product is 3.
    mgr.sequence()->eval<kp::OpTensorSyncLocal>(std::vector<std::shared_ptr<kp::Tensor>>{m.c});
    const float* c = m.c->data();
    if (c[0] != 3.0f || c[m.count / 2] != 3.0f || c[m.count - 1] != 3.0f) {
      state.SkipWithError(absl::StrCat("OpMult: wrong result: c[last] = ", c[m.count - 1]).c_str());
    }
  } catch (const kp::Error& e) {
    state.SkipWithError(e.what());
  }
}

// Makes the core saxpy pair on first use.
absl::Status MakeCoreSaxpy(Env& env) {
  if (env.core_saxpy != nullptr) return absl::OkStatus();
  auto s = std::make_unique<CoreSaxpy>();
  s->count = env.config.saxpy_mb * (uint64_t{1} << 20) / sizeof(float);
  const std::vector<float> ones(s->count, 1.0f), zeros(s->count, 0.0f);
  KD_ASSIGN_OR_RETURN(
      s->x, core::Tensor::Create(env.core_device, core::ElementType::kFloat32, s->count, 0,
                                 core::MemoryType::kDevice, ones.data()));
  KD_ASSIGN_OR_RETURN(
      s->y, core::Tensor::Create(env.core_device, core::ElementType::kFloat32, s->count, 0,
                                 core::MemoryType::kDevice, zeros.data()));
  const kp::Workgroup wg = SaxpyWorkgroup(s->count);
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::CancelWord> word,
                      core::CancelWord::Create(env.core_device));
  for (int v : {kClamped, kUnclamped, kStoppable, kBounded}) {
    core::AlgorithmSpec spec;
    spec.tensors = {s->x, s->y};
    spec.spirv = env.saxpy_spirv;
    spec.workgroup = {wg[0], wg[1], wg[2]};
    spec.push_constants.resize(sizeof(kSaxpyA));
    std::memcpy(spec.push_constants.data(), &kSaxpyA, sizeof(kSaxpyA));
    spec.clamp_buffer_accesses = v != kUnclamped;
    if (v == kStoppable || v == kBounded) spec.cancel = word;
    if (v == kBounded) {
      spec.resident_workgroups =
          env.core_device->ResidentWorkgroupLimit(kSaxpyLocalSize, env.config.dispatch_share);
    }
    KD_ASSIGN_OR_RETURN(s->algorithm[v], core::Algorithm::Create(env.core_device, std::move(spec)));
    KD_ASSIGN_OR_RETURN(s->sequence[v], core::Sequence::Create(env.core_device, 0, 0));
    KD_RETURN_IF_ERROR(s->sequence[v]->Record(core::op::Dispatch{s->algorithm[v], std::nullopt}));
  }
  env.core_saxpy = std::move(s);
  return absl::OkStatus();
}

void RunCoreSaxpy(benchmark::State& state, SaxpyVariant variant) {
  if (absl::Status s = MakeCoreSaxpy(*g_env); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  CoreSaxpy& s = *g_env->core_saxpy;
  core::Sequence& seq = *s.sequence[variant];
  const absl::Duration timeout = absl::Nanoseconds(static_cast<int64_t>(kTimeoutNs));
  for (auto _ : state) {
    if (absl::Status st = seq.Eval(timeout); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
    ++s.dispatches;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(3 * s.count * sizeof(float)));
  // Untimed: y = a * 1 * dispatches everywhere (exact while below 2^24).
  absl::StatusOr<std::unique_ptr<core::Sequence>> check =
      core::Sequence::Create(g_env->core_device, 0, 0);
  absl::Status st = check.status();
  if (st.ok()) st = (*check)->Record(core::op::SyncToHost{{s.y}});
  if (st.ok()) st = (*check)->Eval(timeout);
  const float expected = kSaxpyA * static_cast<float>(s.dispatches);
  const float* y = static_cast<const float*>(s.y->host_data());
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
  } else if (y[0] != expected || y[s.count - 1] != expected) {
    state.SkipWithError(absl::StrCat("core saxpy: wrong result: y[last] = ", y[s.count - 1],
                                     ", expected ", expected)
                            .c_str());
  }
}

void BM_SaxpyCore(benchmark::State& state) { RunCoreSaxpy(state, kClamped); }
void BM_SaxpyCoreUnclamped(benchmark::State& state) { RunCoreSaxpy(state, kUnclamped); }
void BM_SaxpyCoreStoppable(benchmark::State& state) { RunCoreSaxpy(state, kStoppable); }
void BM_SaxpyCoreBounded(benchmark::State& state) { RunCoreSaxpy(state, kBounded); }

// Makes the loop pair on first use: 4096 workgroups of 64 on a GPU, 64 on a CPU device.
absl::Status MakeCoreLoop(Env& env) {
  if (env.core_loop != nullptr) return absl::OkStatus();
  auto l = std::make_unique<CoreLoop>();
  const std::vector<float> zeros(4, 0.0f);
  KD_ASSIGN_OR_RETURN(l->out, core::Tensor::Create(env.core_device, core::ElementType::kFloat32, 4,
                                                   0, core::MemoryType::kDevice, zeros.data()));
  KD_ASSIGN_OR_RETURN(std::shared_ptr<core::CancelWord> word,
                      core::CancelWord::Create(env.core_device));
  const bool cpu = env.core_device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const struct {
    const char* source;
    uint32_t iterations;
  } shapes[2] = {{kLoopShader, kLoopIterations}, {kLoop16Shader, kLoop16Iterations}};
  for (int shape = 0; shape < 2; ++shape) {
    KD_ASSIGN_OR_RETURN(std::vector<uint32_t> spirv,
                        core::CompileGlsl(shapes[shape].source, "loop.comp"));
    for (int v : {kLoopPlain, kLoopStoppable, kLoopBounded}) {
      core::AlgorithmSpec spec;
      spec.tensors = {l->out};
      spec.spirv = spirv;
      spec.workgroup = {cpu ? 64u : 4096u, 1, 1};
      spec.push_constants.resize(sizeof(uint32_t));
      std::memcpy(spec.push_constants.data(), &shapes[shape].iterations, sizeof(uint32_t));
      if (v != kLoopPlain) spec.cancel = word;
      if (v == kLoopBounded) {
        spec.resident_workgroups =
            env.core_device->ResidentWorkgroupLimit(kLoopLocalSize, env.config.dispatch_share);
      }
      KD_ASSIGN_OR_RETURN(l->algorithm[shape][v],
                          core::Algorithm::Create(env.core_device, std::move(spec)));
      KD_ASSIGN_OR_RETURN(l->sequence[shape][v], core::Sequence::Create(env.core_device, 0, 0));
      KD_RETURN_IF_ERROR(
          l->sequence[shape][v]->Record(core::op::Dispatch{l->algorithm[shape][v], std::nullopt}));
    }
  }
  env.core_loop = std::move(l);
  return absl::OkStatus();
}

void RunCoreLoop(benchmark::State& state, int shape, LoopVariant variant) {
  if (absl::Status s = MakeCoreLoop(*g_env); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  core::Sequence& seq = *g_env->core_loop->sequence[shape][variant];
  const absl::Duration timeout = absl::Nanoseconds(static_cast<int64_t>(kTimeoutNs));
  for (auto _ : state) {
    if (absl::Status st = seq.Eval(timeout); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
}

void BM_LoopCore(benchmark::State& state) { RunCoreLoop(state, 0, kLoopPlain); }
void BM_LoopCoreStoppable(benchmark::State& state) { RunCoreLoop(state, 0, kLoopStoppable); }
void BM_LoopCoreBounded(benchmark::State& state) { RunCoreLoop(state, 0, kLoopBounded); }
void BM_Loop16Core(benchmark::State& state) { RunCoreLoop(state, 1, kLoopPlain); }
void BM_Loop16CoreStoppable(benchmark::State& state) { RunCoreLoop(state, 1, kLoopStoppable); }
void BM_Loop16CoreBounded(benchmark::State& state) { RunCoreLoop(state, 1, kLoopBounded); }

// ---------------------------------------------------------------------------------------------
// Reporting: the console output, plus the run's results kept for the summary.

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  using ConsoleReporter::ConsoleReporter;

  void ReportRuns(const std::vector<Run>& reports) override {
    for (const Run& run : reports) {
      if (run.error_occurred) continue;
      Samples* s = nullptr;
      if (run.run_type == Run::RT_Iteration) {
        s = &runs_[run.run_name.function_name];
      } else if (run.aggregate_name == "mean") {
        s = &means_[run.run_name.function_name];
      } else {
        continue;
      }
      s->seconds.push_back(run.GetAdjustedRealTime() /
                           benchmark::GetTimeUnitMultiplier(run.time_unit));
      auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) s->bytes_per_second.push_back(it->second.value);
      it = run.counters.find("items_per_second");
      if (it != run.counters.end()) s->items_per_second.push_back(it->second.value);
      for (const auto& [name, counter] : run.counters) {
        s->counters[name].push_back(counter.value);
      }
    }
    ConsoleReporter::ReportRuns(reports);
  }

  // Mean real time per iteration (seconds) over the runs (repetitions) of a benchmark; from the
  // "mean" aggregate when only aggregates were reported (--benchmark_report_aggregates_only).
  std::optional<double> MeanSeconds(const std::string& name) const {
    const Samples* s = Find(name);
    return s == nullptr ? std::nullopt : Mean(s->seconds);
  }
  std::optional<double> MeanBytesPerSecond(const std::string& name) const {
    const Samples* s = Find(name);
    return s == nullptr ? std::nullopt : Mean(s->bytes_per_second);
  }
  std::optional<double> MeanItemsPerSecond(const std::string& name) const {
    const Samples* s = Find(name);
    return s == nullptr ? std::nullopt : Mean(s->items_per_second);
  }
  // A user counter's mean over the runs.
  std::optional<double> MeanCounter(const std::string& name, const std::string& counter) const {
    const Samples* s = Find(name);
    if (s == nullptr) return std::nullopt;
    auto it = s->counters.find(counter);
    return it == s->counters.end() ? std::nullopt : Mean(it->second);
  }

 private:
  struct Samples {
    std::vector<double> seconds;
    std::vector<double> bytes_per_second;
    std::vector<double> items_per_second;
    std::map<std::string, std::vector<double>> counters;
  };
  const Samples* Find(const std::string& name) const {
    if (auto it = runs_.find(name); it != runs_.end()) return &it->second;
    if (auto it = means_.find(name); it != means_.end()) return &it->second;
    return nullptr;
  }
  static std::optional<double> Mean(const std::vector<double>& v) {
    if (v.empty()) return std::nullopt;
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  }
  std::map<std::string, Samples> runs_;   // one entry per repetition
  std::map<std::string, Samples> means_;  // "mean" aggregates
};

std::optional<double> Ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b <= 0) return std::nullopt;
  return *a / *b;
}

// Prints "ratio kp/raw (tiny sequence): 1.04  target <= 1.10  [met]"; false when missed.
bool PrintRatio(const std::string& what, std::optional<double> ratio, bool at_most, double target) {
  if (!ratio) {
    std::cout << absl::StrFormat("ratio %s: n/a (not measured)\n", what);
    return true;
  }
  const bool met = at_most ? *ratio <= target : *ratio >= target;
  std::cout << absl::StrFormat("ratio %s: %.2f  target %s %.2f  [%s]\n", what, *ratio,
                               at_most ? "<=" : ">=", target, met ? "met" : "NOT met");
  return met;
}

// Prints "ratio remote/in-process (async evals): 0.80" (a figure to watch, no target).
void PrintInfoRatio(const std::string& what, std::optional<double> ratio) {
  if (!ratio) {
    std::cout << absl::StrFormat("ratio %s: n/a (not measured)\n", what);
  } else {
    std::cout << absl::StrFormat("ratio %s: %.2f\n", what, *ratio);
  }
}

std::optional<double> Sum(std::optional<double> a, std::optional<double> b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}

std::string Micros(std::optional<double> seconds) {
  return seconds ? absl::StrFormat("%.1f us", *seconds * 1e6) : "n/a";
}
std::string GBps(std::optional<double> bytes_per_second) {
  return bytes_per_second ? absl::StrFormat("%.2f GB/s", *bytes_per_second / 1e9) : "n/a";
}
std::string PerSecond(std::optional<double> items_per_second) {
  return items_per_second ? absl::StrFormat("%.0f/s", *items_per_second) : "n/a";
}

// The benchmark names, which are also the summary's keys.
constexpr char kTinyRaw[] = "tiny/raw";
constexpr char kTinyRawSpin[] = "tiny/raw_spin";
constexpr char kTinyCore[] = "tiny/core";
constexpr char kTinyCoreUnclamped[] = "tiny/core_unclamped";
constexpr char kTinyKp[] = "tiny/kp";
constexpr char kUploadRaw[] = "upload_256MiB/raw";
constexpr char kUploadKp[] = "upload_256MiB/kp";
constexpr char kDownloadRaw[] = "download_256MiB/raw";
constexpr char kDownloadKp[] = "download_256MiB/kp";
constexpr char kUploadGiBKp[] = "upload_1GiB/kp";
constexpr char kDownloadGiBKp[] = "download_1GiB/kp";
constexpr char kLoopCore[] = "loop/core";
constexpr char kLoopCoreStoppable[] = "loop/core_stoppable";
constexpr char kLoop16Core[] = "loop16/core";
constexpr char kLoop16CoreStoppable[] = "loop16/core_stoppable";
constexpr char kLoopCoreBounded[] = "loop/core_bounded";
constexpr char kLoop16CoreBounded[] = "loop16/core_bounded";

// True when every target was met.
bool PrintSummary(const SummaryReporter& r, const std::string& saxpy_name,
                  const std::string& saxpy_core, const std::string& saxpy_core_unclamped,
                  const std::string& saxpy_core_stoppable, const std::string& saxpy_core_bounded) {
  const auto raw = r.MeanSeconds(kTinyRaw);
  const auto core_s = r.MeanSeconds(kTinyCore);
  const auto kp_s = r.MeanSeconds(kTinyKp);
  std::cout << "\nsummary (" << g_env->device_name << ")\n";
  const auto raw_spin = r.MeanSeconds(kTinyRawSpin);
  std::cout << "tiny sequence, mean per round trip: raw " << Micros(raw) << " (polling first "
            << Micros(raw_spin) << "), core " << Micros(core_s) << ", kp " << Micros(kp_s) << "\n";
  PrintInfoRatio("kp/raw polling its fence for 50 us before it sleeps (tiny sequence)",
                 Ratio(kp_s, raw_spin));
  std::cout << "upload 256 MiB: raw " << GBps(r.MeanBytesPerSecond(kUploadRaw)) << ", kp "
            << GBps(r.MeanBytesPerSecond(kUploadKp)) << "\n";
  std::cout << "download 256 MiB: raw " << GBps(r.MeanBytesPerSecond(kDownloadRaw)) << ", kp "
            << GBps(r.MeanBytesPerSecond(kDownloadKp)) << "\n";
  std::cout << "saxpy " << g_env->config.saxpy_mb << " MiB (3 x 4 bytes per element): kp "
            << GBps(r.MeanBytesPerSecond(saxpy_name)) << "\n";
  const std::string mult_name = absl::StrCat("opmult_", g_env->config.saxpy_mb, "MiB/kp");
  std::cout << "OpMult over the same size (3 x 4 bytes per element): kp "
            << GBps(r.MeanBytesPerSecond(mult_name)) << "\n";
  PrintInfoRatio("OpMult/saxpy (GB/s)",
                 Ratio(r.MeanBytesPerSecond(mult_name), r.MeanBytesPerSecond(saxpy_name)));
  const auto core_unclamped = r.MeanSeconds(kTinyCoreUnclamped);
  const auto saxpy_clamped_s = r.MeanSeconds(saxpy_core);
  const auto saxpy_unclamped_s = r.MeanSeconds(saxpy_core_unclamped);
  std::cout << "clamped buffer accesses: tiny core " << Micros(core_s) << " vs unclamped "
            << Micros(core_unclamped) << "; saxpy core " << GBps(r.MeanBytesPerSecond(saxpy_core))
            << " vs unclamped " << GBps(r.MeanBytesPerSecond(saxpy_core_unclamped)) << "\n";
  PrintInfoRatio("clamped/unclamped (tiny sequence time)", Ratio(core_s, core_unclamped));
  PrintInfoRatio("clamped/unclamped (saxpy time)", Ratio(saxpy_clamped_s, saxpy_unclamped_s));
  std::cout << "the watchdog's cancel checks (as the daemon runs every algorithm): saxpy core "
            << GBps(r.MeanBytesPerSecond(saxpy_core_stoppable)) << " vs without "
            << GBps(r.MeanBytesPerSecond(saxpy_core)) << "; loop "
            << Micros(r.MeanSeconds(kLoopCoreStoppable)) << " vs without "
            << Micros(r.MeanSeconds(kLoopCore)) << "; loop of 16 steps per iteration "
            << Micros(r.MeanSeconds(kLoop16CoreStoppable)) << " vs without "
            << Micros(r.MeanSeconds(kLoop16Core)) << "\n";
  PrintInfoRatio("stoppable/plain (saxpy time)",
                 Ratio(r.MeanSeconds(saxpy_core_stoppable), saxpy_clamped_s));
  PrintInfoRatio("stoppable/plain (loop time)",
                 Ratio(r.MeanSeconds(kLoopCoreStoppable), r.MeanSeconds(kLoopCore)));
  PrintInfoRatio("stoppable/plain (loop of 16 steps per iteration, time)",
                 Ratio(r.MeanSeconds(kLoop16CoreStoppable), r.MeanSeconds(kLoop16Core)));
  const uint32_t bound =
      g_env->core_device->ResidentWorkgroupLimit(kSaxpyLocalSize, g_env->config.dispatch_share);
  std::cout << "dispatches bounded to " << g_env->config.dispatch_share
            << " of the device's invocation slots (--dispatch_share; "
            << (bound == 0 ? std::string("this device reports none: no bound")
                           : absl::StrCat(bound, " resident workgroups of ", kSaxpyLocalSize))
            << "), with the cancel checks: saxpy core "
            << GBps(r.MeanBytesPerSecond(saxpy_core_bounded)) << "; loop "
            << Micros(r.MeanSeconds(kLoopCoreBounded)) << "; loop of 16 steps per iteration "
            << Micros(r.MeanSeconds(kLoop16CoreBounded)) << "\n";
  PrintInfoRatio("bounded/stoppable (saxpy time)",
                 Ratio(r.MeanSeconds(saxpy_core_bounded), r.MeanSeconds(saxpy_core_stoppable)));
  PrintInfoRatio("bounded/stoppable (loop time)",
                 Ratio(r.MeanSeconds(kLoopCoreBounded), r.MeanSeconds(kLoopCoreStoppable)));
  PrintInfoRatio("bounded/stoppable (loop of 16 steps per iteration, time)",
                 Ratio(r.MeanSeconds(kLoop16CoreBounded), r.MeanSeconds(kLoop16CoreStoppable)));
  bool met = true;
  met &= PrintRatio("core/raw (tiny sequence)", Ratio(core_s, raw), true, 1.10);
  met &= PrintRatio("kp/raw (tiny sequence)", Ratio(kp_s, raw), true, 1.10);
  met &= PrintRatio("kp/raw (upload 256 MiB throughput)",
                    Ratio(r.MeanBytesPerSecond(kUploadKp), r.MeanBytesPerSecond(kUploadRaw)), false,
                    0.90);
  met &= PrintRatio("kp/raw (download 256 MiB throughput)",
                    Ratio(r.MeanBytesPerSecond(kDownloadKp), r.MeanBytesPerSecond(kDownloadRaw)),
                    false, 0.90);
  if (g_env->remote == nullptr) {
    std::cout << "remote: skipped (KOMPUTED_BENCH_REMOTE=0)\n";
    return met;
  }
  namespace kb = komputed_bench;
  const auto ping = r.MeanSeconds(kb::kPing);
  const auto tiny_in = r.MeanSeconds(kb::kTinyEvalInprocess);
  const auto tiny_remote = r.MeanSeconds(kb::kTinyEvalRemote);
  const auto async_in = r.MeanItemsPerSecond(kb::kAsyncInprocess);
  const auto async_remote = r.MeanItemsPerSecond(kb::kAsyncRemote);
  const auto tcp = r.MeanBytesPerSecond(kb::kTcpLoopback);
  const auto up_remote = r.MeanBytesPerSecond(kb::kUploadRemote);
  const auto down_remote = r.MeanBytesPerSecond(kb::kDownloadRemote);
  std::cout << "\nremote (daemon " << g_env->remote->tcp_daemon_where() << " at "
            << g_env->remote->address() << ", TCP loopback)\n";
  std::cout << "gRPC ping, mean round trip: " << Micros(ping) << "\n";
  std::cout << "tcp loopback 256 MiB: " << GBps(tcp) << "\n";
  std::cout << "tiny eval, mean: in-process " << Micros(tiny_in) << ", remote "
            << Micros(tiny_remote) << " (in-process + ping " << Micros(Sum(tiny_in, ping)) << ")\n";
  if (const auto other = r.MeanSeconds(kb::kTinyEvalInprocessDefaultFamily); other.has_value()) {
    const core::PhysicalDeviceInfo& info = g_env->core_device->info();
    std::cout << "in-process tiny eval on kp's default queue family (" << KpDefaultFamily(info)
              << "): " << Micros(other) << "; the in-process side of the remote ratios runs on "
              << "the daemon's session family ("
              << komputed::server::DefaultSessionFamilies(info).front() << ")\n";
  }
  const auto async_unbatched = r.MeanItemsPerSecond(kb::kAsyncRemoteUnbatched);
  const auto async_alone = r.MeanItemsPerSecond(kb::kAsyncRemoteAlone);
  auto cpu_per_eval = [&](const char* name) {
    const std::optional<double> v = r.MeanCounter(name, kb::kProcessCpuPerEval);
    return v.has_value() ? absl::StrFormat("%.1f us", *v) : std::string("n/a");
  };
  std::cout << "async evals (" << g_env->config.async_depth << " in flight): in-process "
            << PerSecond(async_in) << ", remote " << PerSecond(async_remote)
            << ", remote without batches " << PerSecond(async_unbatched)
            << ", remote with each eval submitted alone " << PerSecond(async_alone) << "\n";
  // The targets: on the async evals taken in turn (async_evals/interleaved), which share the
  // host's and the device's state of the moment.
  const auto turn_async_in =
      r.MeanCounter(kb::kAsyncEvalsInterleaved, kb::kAsyncInterleavedInprocess);
  const auto turn_async_remote =
      r.MeanCounter(kb::kAsyncEvalsInterleaved, kb::kAsyncInterleavedRemote);
  const auto turn_async_same =
      r.MeanCounter(kb::kAsyncEvalsInterleaved, kb::kAsyncInterleavedSameHost);
  std::cout << "async evals taken in turn: in-process " << PerSecond(turn_async_in) << ", remote "
            << PerSecond(turn_async_remote) << ", same host " << PerSecond(turn_async_same) << "\n";
  std::cout << "process CPU per async eval: in-process " << cpu_per_eval(kb::kAsyncInprocess)
            << ", remote " << cpu_per_eval(kb::kAsyncRemote) << ", remote without batches "
            << cpu_per_eval(kb::kAsyncRemoteUnbatched) << ", remote with each eval submitted alone "
            << cpu_per_eval(kb::kAsyncRemoteAlone) << " (client and daemon together)\n";
  std::cout << "upload 256 MiB: remote " << GBps(up_remote) << ", kp in-process "
            << GBps(r.MeanBytesPerSecond(kUploadKp)) << "\n";
  std::cout << "download 256 MiB: remote " << GBps(down_remote) << ", kp in-process "
            << GBps(r.MeanBytesPerSecond(kDownloadKp)) << "\n";
  // "request to handler 90.8, behind earlier evals 0.1, prepare 20.2, ...": the stage counters of
  // `name`.
  auto stages_text = [&r](const char* name) {
    auto us = [&](const char* counter) {
      const std::optional<double> v = r.MeanCounter(name, counter);
      return v.has_value() ? absl::StrFormat("%.1f", *v) : std::string("-");
    };
    return absl::StrCat("request to handler ", us(kb::kStageRequest), ", behind earlier evals ",
                        us(kb::kStageQueued), ", prepare ", us(kb::kStagePrepare), ", submit ",
                        us(kb::kStageSubmit), ", device and wait ", us(kb::kStageDevice),
                        ", answer ", us(kb::kStageAnswer), ", answer to client ",
                        us(kb::kStageResponse), " (waited inline: ", us(kb::kStageInline), ")");
  };
  if (const auto stages = r.MeanSeconds(kb::kTinyEvalStages); stages.has_value()) {
    std::cout << "tiny eval through the gRPC API alone, " << Micros(stages)
              << " mean; its stages in us: " << stages_text(kb::kTinyEvalStages) << "\n";
    if (tiny_remote.has_value()) {
      // The two rows run one after the other: on a host whose speed moves between them, the
      // difference says nothing, and a negative one is not printed as a share.
      std::cout << "kp client's own share of the remote tiny eval (remote - gRPC API alone): ";
      if (*tiny_remote >= *stages) {
        std::cout << Micros(*tiny_remote - *stages) << "\n";
      } else {
        std::cout << "n/a (the gRPC API alone took longer than kp's remote eval, taken at "
                     "another moment)\n";
      }
    }
  }
  if (const auto rate = r.MeanItemsPerSecond(kb::kAsyncEvalStages); rate.has_value()) {
    std::cout << "async evals through the gRPC API alone (" << g_env->config.async_depth
              << " in flight on one Execute stream), " << PerSecond(rate)
              << "; each eval's stages in us: " << stages_text(kb::kAsyncEvalStages) << "\n";
  }
  // The issue's targets: 1.25 on a CPU device, 1.1 on a GPU. Judged on the evals and pings taken
  // in turn (tiny_eval/interleaved), which share the device's clocks and the host's load of the
  // moment; the separate runs' ratio is shown beside it.
  const bool cpu = g_env->core_device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const auto us = [](std::optional<double> v) -> std::optional<double> {
    if (!v.has_value()) return std::nullopt;
    return *v * 1e-6;
  };
  const auto turn_in =
      us(r.MeanCounter(kb::kTinyEvalInterleaved, kb::kTinyEvalInterleavedInprocess));
  const auto turn_remote =
      us(r.MeanCounter(kb::kTinyEvalInterleaved, kb::kTinyEvalInterleavedRemote));
  const auto turn_same =
      us(r.MeanCounter(kb::kTinyEvalInterleaved, kb::kTinyEvalInterleavedSameHost));
  const auto turn_ping = us(r.MeanCounter(kb::kTinyEvalInterleaved, kb::kTinyEvalInterleavedPing));
  std::cout << "tiny evals taken in turn, mean: in-process " << Micros(turn_in) << ", remote "
            << Micros(turn_remote) << ", same host " << Micros(turn_same) << "; komputed ping "
            << Micros(turn_ping) << "\n";
  const auto first = [&](const char* counter) {
    return us(r.MeanCounter(kb::kTinyEvalInterleaved, kb::FirstOfRun(counter)));
  };
  std::cout << "the first eval of each run of " << kb::kTinyEvalInterleavedRun
            << " taken in turn, mean: in-process "
            << Micros(first(kb::kTinyEvalInterleavedInprocess)) << ", remote "
            << Micros(first(kb::kTinyEvalInterleavedRemote)) << ", same host "
            << Micros(first(kb::kTinyEvalInterleavedSameHost)) << "\n";
  // The ratios in turn divide by the in-process lane as it runs in turn. Where taking turns slows
  // that lane itself (on a GPU, a run that follows another process's runs its whole length
  // slower), they flatter the remote paths: this says by how much.
  PrintInfoRatio("in-process tiny eval, in turn/in its own run", Ratio(turn_in, tiny_in));
  PrintInfoRatio("remote/(in-process + ping) (tiny eval), each in its own run",
                 Ratio(tiny_remote, Sum(tiny_in, ping)));
  met &= PrintRatio("remote/(in-process + ping) (tiny eval), in turn",
                    Ratio(turn_remote, Sum(turn_in, turn_ping)), true, cpu ? 1.25 : 1.1);
  // The device answers a submission later when it has idled since the last one: the in-process
  // evals paced as far apart as the remote ones show how much of the remote eval that is.
  const auto tiny_paced = r.MeanSeconds(kb::kTinyEvalInprocessPaced);
  std::cout << "in-process tiny eval with " << absl::FormatDuration(kb::kTinyEvalPacedGap)
            << " between evals (as far apart as the remote ones): " << Micros(tiny_paced) << "\n";
  PrintInfoRatio("remote/(in-process paced + ping) (tiny eval)",
                 Ratio(tiny_remote, Sum(tiny_paced, ping)));
  const auto ping_bare = r.MeanSeconds(kb::kPingBare);
  std::cout << "gRPC ping on a bare completion-queue server of this build: " << Micros(ping_bare)
            << "\n";
  const auto ping_callback = r.MeanSeconds(kb::kPingBareCallback);
  std::cout << "gRPC ping on a bare callback server of this build: " << Micros(ping_callback)
            << "\n";
  PrintInfoRatio("komputed ping/bare async server ping, each in its own run",
                 Ratio(ping, ping_bare));
  // The target: the pings taken in turn, so that both share the host's state of the moment.
  const auto turn_komputed = us(r.MeanCounter(kb::kPingInterleaved, kb::kPingInterleavedKomputed));
  const auto turn_bare = us(r.MeanCounter(kb::kPingInterleaved, kb::kPingInterleavedBare));
  const auto turn_callback = us(r.MeanCounter(kb::kPingInterleaved, kb::kPingInterleavedCallback));
  std::cout << "gRPC pings taken in turn: komputed " << Micros(turn_komputed)
            << ", bare completion-queue server " << Micros(turn_bare) << ", bare callback server "
            << Micros(turn_callback) << "\n";
  PrintInfoRatio("bare callback/bare async server ping, in turn", Ratio(turn_callback, turn_bare));
  met &= PrintRatio("komputed ping/bare async server ping, in turn",
                    Ratio(turn_komputed, turn_bare), true, 1.2);
  const auto tiny_token = r.MeanSeconds(kb::kTinyEvalToken);
  const auto tiny_tls = r.MeanSeconds(kb::kTinyEvalTls);
  std::cout << "tiny eval, mean: with a bearer token " << Micros(tiny_token) << ", over TLS "
            << Micros(tiny_tls) << "\n";
  PrintInfoRatio("token/none (remote tiny eval), each in its own run",
                 Ratio(tiny_token, tiny_remote));
  PrintInfoRatio("tls/plain (remote tiny eval), each in its own run", Ratio(tiny_tls, tiny_remote));
  // The targets: on the evals taken in turn (tiny_eval/secure_interleaved).
  const auto secure = [&](const char* counter) {
    return us(r.MeanCounter(kb::kTinyEvalSecureInterleaved, counter));
  };
  const auto turn_plain = secure(kb::kTinyEvalInterleavedRemote);
  const auto turn_token_sent = secure(kb::kTinyEvalInterleavedTokenSent);
  const auto turn_token = secure(kb::kTinyEvalInterleavedToken);
  const auto turn_tls = secure(kb::kTinyEvalInterleavedTls);
  std::cout << "remote tiny evals taken in turn, mean: plain " << Micros(turn_plain)
            << ", a token sent to the plain daemon " << Micros(turn_token_sent)
            << ", a token checked " << Micros(turn_token) << ", TLS " << Micros(turn_tls) << "\n";
  PrintInfoRatio("token sent/none (remote tiny eval, the daemon not checking it), in turn",
                 Ratio(turn_token_sent, turn_plain));
  met &= PrintRatio("token/none (remote tiny eval), in turn", Ratio(turn_token, turn_plain), true,
                    1.05);
  met &=
      PrintRatio("tls/plain (remote tiny eval), in turn", Ratio(turn_tls, turn_plain), true, 1.20);
  PrintInfoRatio("remote/in-process (async evals per second), each in its own run",
                 Ratio(async_remote, async_in));
  met &= PrintRatio("remote/in-process (async evals per second), in turn",
                    Ratio(turn_async_remote, turn_async_in), false, 0.5);
  PrintInfoRatio("batched/unbatched (remote async evals per second)",
                 Ratio(async_remote, async_unbatched));
  PrintInfoRatio("submitted together/alone (remote async evals per second)",
                 Ratio(async_remote, async_alone));
  if (const auto share = r.MeanCounter(kb::kAsyncRemote, kb::kSubmittedTogether);
      share.has_value()) {
    std::cout << "remote async evals that shared a vkQueueSubmit with others: "
              << absl::StrFormat("%.0f%%", 100 * *share) << "\n";
  }
  // The targets: on the transfers taken in turn (transfers_256MiB/interleaved), which share the
  // host's load of the moment; the separate runs' ratios are shown beside them.
  const auto turn_tcp = r.MeanCounter(kb::kTransfersInterleaved, kb::kTransfersInterleavedTcp);
  const auto turn_up = r.MeanCounter(kb::kTransfersInterleaved, kb::kTransfersInterleavedUpload);
  const auto turn_down =
      r.MeanCounter(kb::kTransfersInterleaved, kb::kTransfersInterleavedDownload);
  std::cout << "256 MiB transfers taken in turn: tcp loopback " << GBps(turn_tcp) << ", upload "
            << GBps(turn_up) << ", download " << GBps(turn_down) << "\n";
  PrintInfoRatio("remote/tcp_loopback (upload 256 MiB throughput), each in its own run",
                 Ratio(up_remote, tcp));
  PrintInfoRatio("remote/tcp_loopback (download 256 MiB throughput), each in its own run",
                 Ratio(down_remote, tcp));
  met &= PrintRatio("remote/tcp_loopback (upload 256 MiB throughput), in turn",
                    Ratio(turn_up, turn_tcp), false, 0.50);
  met &= PrintRatio("remote/tcp_loopback (download 256 MiB throughput), in turn",
                    Ratio(turn_down, turn_tcp), false, 0.50);
  PrintInfoRatio("remote/in-process (upload 256 MiB throughput)",
                 Ratio(up_remote, r.MeanBytesPerSecond(kUploadKp)));
  PrintInfoRatio("remote/in-process (download 256 MiB throughput)",
                 Ratio(down_remote, r.MeanBytesPerSecond(kDownloadKp)));

  // Same host: a Unix socket, and the tensors' host data in memory shared with the daemon. The
  // sync targets are the issue's: 0.5 of in-process on a CPU device, 0.8 on a GPU.
  const auto tiny_same = r.MeanSeconds(kb::kTinyEvalSameHost);
  const auto async_same = r.MeanItemsPerSecond(kb::kAsyncSameHost);
  const auto up_same = r.MeanBytesPerSecond(kb::kUploadSameHost);
  const auto down_same = r.MeanBytesPerSecond(kb::kDownloadSameHost);
  const std::optional<uint64_t> shared = g_env->remote->same_host_shared_tensors();
  const std::optional<uint64_t> rings = g_env->remote->same_host_rings();
  std::cout << "\nsame host (daemon " << g_env->remote->daemons_where() << " at "
            << g_env->remote->same_host_address() << ", "
            << (shared.has_value() ? absl::StrCat(*shared) : "an unknown number of")
            << " tensors made over shared memory; "
            << (rings.has_value() ? absl::StrCat(*rings) : "an unknown number of")
            << " eval channels with a ring"
            << (kp::internal::remote::SameHostChannel::RingWanted()
                    ? ""
                    : ", none wanted: KOMPUTED_SAME_HOST_RING=0")
            << ")\n";
  std::cout << "tiny eval, mean: in-process " << Micros(tiny_in) << ", same host "
            << Micros(tiny_same) << "\n";
  const auto word_wakes = r.MeanCounter(kb::kTinyEvalSameHost, kb::kWordWakeShare);
  const auto socket_wakes = r.MeanCounter(kb::kTinyEvalSameHost, kb::kSocketWakeShare);
  if (word_wakes.has_value() && socket_wakes.has_value()) {
    std::cout << absl::StrFormat(
        "same-host tiny evals whose answer woke the client: %.0f%% on the ring's answer word, "
        "%.0f%% with a doorbell on the socket (the rest found it polling)\n",
        100 * *word_wakes, 100 * *socket_wakes);
  }
  if (const auto stages = r.MeanSeconds(kb::kTinyEvalSameHostStages); stages.has_value()) {
    std::cout << "tiny eval on the same-host channel alone, " << Micros(stages)
              << " mean; its stages in us: " << stages_text(kb::kTinyEvalSameHostStages)
              << " (the request's stage ends where the daemon begins the eval)\n";
  }
  // Two programs at once on one device: in-process each (two device contexts) or both on the
  // same-host daemon (one). Each lane against itself alone says what sharing costs that path.
  const auto in_beside = r.MeanSeconds(kb::kTinyEvalInprocessBeside);
  const auto same_beside = r.MeanSeconds(kb::kTinyEvalSameHostBeside);
  std::cout << "tiny eval while another program evaluates it too, mean: in-process beside another "
               "process "
            << Micros(in_beside) << " (alone " << Micros(tiny_in)
            << "), same host beside another session of the daemon " << Micros(same_beside)
            << " (alone " << Micros(tiny_same) << "); the other program's evals meanwhile: "
            << Micros(us(r.MeanCounter(kb::kTinyEvalInprocessBeside, kb::kOtherEvalMicros)))
            << " in its own process, "
            << Micros(us(r.MeanCounter(kb::kTinyEvalSameHostBeside, kb::kOtherEvalMicros)))
            << " in its session\n";
  PrintInfoRatio("in-process tiny eval, beside another program/alone", Ratio(in_beside, tiny_in));
  PrintInfoRatio("same-host tiny eval, beside another program/alone",
                 Ratio(same_beside, tiny_same));
  PrintInfoRatio("same-host/in-process (tiny eval, each beside another program)",
                 Ratio(same_beside, in_beside));
  std::cout << "async evals: same host " << PerSecond(async_same);
  if (const auto share = r.MeanCounter(kb::kAsyncSameHost, kb::kChannelShare); share.has_value()) {
    std::cout << absl::StrFormat(", %.0f%% of them taken on the same-host channel", 100 * *share);
  }
  std::cout << "\n";
  std::cout << "upload 256 MiB: same host " << GBps(up_same) << ", kp in-process "
            << GBps(r.MeanBytesPerSecond(kUploadKp)) << "\n";
  std::cout << "download 256 MiB: same host " << GBps(down_same) << ", kp in-process "
            << GBps(r.MeanBytesPerSecond(kDownloadKp)) << "\n";
  const double sync_target = cpu ? 0.5 : 0.8;
  if (!shared.has_value()) {
    std::cout << "same host: the daemon's metrics did not answer, so whether the fast path was "
                 "taken is not known  [NOT met]\n";
    met = false;
  } else if (*shared == 0) {
    std::cout << "same host: no tensor was made over shared memory (the fast path was not "
                 "taken; see the log)  [NOT met]\n";
    met = false;
  }
  auto if_shared = [taken = shared.value_or(0) > 0](std::optional<double> ratio) {
    return taken ? ratio : std::nullopt;  // not the fast path: its figures do not count
  };
  met &= PrintRatio("same-host/in-process (upload 256 MiB throughput)",
                    if_shared(Ratio(up_same, r.MeanBytesPerSecond(kUploadKp))), false, sync_target);
  met &= PrintRatio("same-host/in-process (download 256 MiB throughput)",
                    if_shared(Ratio(down_same, r.MeanBytesPerSecond(kDownloadKp))), false,
                    sync_target);
  if (g_env->remote->gib_transfers()) {
    const auto up_gib = r.MeanBytesPerSecond(kb::kUploadGiBSameHost);
    const auto down_gib = r.MeanBytesPerSecond(kb::kDownloadGiBSameHost);
    std::cout << "upload 1 GiB: same host " << GBps(up_gib) << ", kp in-process "
              << GBps(r.MeanBytesPerSecond(kUploadGiBKp)) << "\n";
    std::cout << "download 1 GiB: same host " << GBps(down_gib) << ", kp in-process "
              << GBps(r.MeanBytesPerSecond(kDownloadGiBKp)) << "\n";
    met &= PrintRatio("same-host/in-process (upload 1 GiB throughput)",
                      if_shared(Ratio(up_gib, r.MeanBytesPerSecond(kUploadGiBKp))), false,
                      sync_target);
    met &= PrintRatio("same-host/in-process (download 1 GiB throughput)",
                      if_shared(Ratio(down_gib, r.MeanBytesPerSecond(kDownloadGiBKp))), false,
                      sync_target);
  }
  PrintInfoRatio("same-host/in-process (tiny eval), each in its own run",
                 if_shared(Ratio(tiny_same, tiny_in)));
  met &= PrintRatio("same-host/in-process (tiny eval), in turn",
                    if_shared(Ratio(turn_same, turn_in)), true, 1.5);
  PrintInfoRatio("same-host/in-process paced (tiny eval)",
                 if_shared(Ratio(tiny_same, r.MeanSeconds(kb::kTinyEvalInprocessPaced))));
  PrintInfoRatio("same-host/in-process (async evals per second), each in its own run",
                 if_shared(Ratio(async_same, async_in)));
  met &= PrintRatio("same-host/in-process (async evals per second), in turn",
                    if_shared(Ratio(turn_async_same, turn_async_in)), false, 0.5);

  // The async evals of copy-only sequences: the serving path without the device's time.
  const auto copies_in = r.MeanItemsPerSecond(kb::kAsyncCopyInprocess);
  const auto copies_remote = r.MeanItemsPerSecond(kb::kAsyncCopyRemote);
  const auto copies_same = r.MeanItemsPerSecond(kb::kAsyncCopySameHost);
  std::cout << "async evals of copy-only sequences (" << g_env->config.async_depth
            << " in flight): in-process " << PerSecond(copies_in) << ", remote "
            << PerSecond(copies_remote) << ", same host " << PerSecond(copies_same) << "\n";
  PrintInfoRatio("remote/in-process (async copy-only evals per second)",
                 Ratio(copies_remote, copies_in));
  PrintInfoRatio("same-host/in-process (async copy-only evals per second)",
                 Ratio(copies_same, copies_in));
  return met;
}

}  // namespace

int main(int argc, char** argv) {
  // As the komputed binary does (server/main.cc): no lock-graph checks on every mutex.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::string_view kind = argc == 2 ? argv[1] : "";
      absl::ConsumePrefix(&kind, absl::StrCat(komputed_bench::kBarePingServe, "="))) {
    return komputed_bench::ServeBarePing(kind);
  }
  if (absl::string_view target = argc == 2 ? argv[1] : "";
      absl::ConsumePrefix(&target, absl::StrCat(komputed_bench::kTinyEvalLoop, "="))) {
    absl::StatusOr<std::vector<uint32_t>> spirv = core::CompileGlsl(kTinyShader, "tiny.comp");
    if (!spirv.ok()) {
      std::cerr << "komputed_bench: " << spirv.status() << "\n";
      return 1;
    }
    return komputed_bench::RunTinyEvalLoop(target, *spirv);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  Env env;
  env.config = ReadConfig();
  g_env = &env;
  if (absl::Status s = SetUp(env); !s.ok()) {
    std::cerr << "komputed_bench: setup failed: " << s << "\n";
    env.Teardown();
    return 1;
  }
  const core::PhysicalDeviceInfo& info = env.core_device->info();
  benchmark::AddCustomContext("vulkan_device", env.device_name);
  benchmark::AddCustomContext("vulkan_api",
                              absl::StrCat(VK_API_VERSION_MAJOR(info.properties.apiVersion), ".",
                                           VK_API_VERSION_MINOR(info.properties.apiVersion), ".",
                                           VK_API_VERSION_PATCH(info.properties.apiVersion)));
  benchmark::AddCustomContext("vulkan_driver_version", absl::StrCat(info.properties.driverVersion));

  const Config& c = env.config;
  const std::string saxpy_name = absl::StrCat("saxpy_", c.saxpy_mb, "MiB/kp");
  const std::string saxpy_core = absl::StrCat("saxpy_", c.saxpy_mb, "MiB/core");
  const std::string saxpy_core_unclamped = absl::StrCat("saxpy_", c.saxpy_mb, "MiB/core_unclamped");
  const std::string saxpy_core_stoppable = absl::StrCat("saxpy_", c.saxpy_mb, "MiB/core_stoppable");
  const std::string saxpy_core_bounded = absl::StrCat("saxpy_", c.saxpy_mb, "MiB/core_bounded");
  const std::string loop_core_bounded = kLoopCoreBounded, loop16_core_bounded = kLoop16CoreBounded;
  const std::string loop_core = kLoopCore, loop_core_stoppable = kLoopCoreStoppable;
  const std::string loop16_core = kLoop16Core, loop16_core_stoppable = kLoop16CoreStoppable;
  benchmark::RegisterBenchmark(kTinyRaw, BM_TinyRaw)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyRawSpin, BM_TinyRawSpin)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyCore, BM_TinyCore)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyCoreUnclamped, BM_TinyCoreUnclamped)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark(kTinyKp, BM_TinyKp)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMicrosecond);
  if (env.remote != nullptr) env.remote->RegisterLatencyBenchmarks();
  struct Bulk {
    const char* name;
    void (*fn)(benchmark::State&);
  };
  auto register_bulk = [&](const Bulk& b) {
    benchmark::RegisterBenchmark(b.name, b.fn)
        ->UseRealTime()
        ->Iterations(c.bulk_iterations)
        ->Unit(benchmark::kMillisecond);
  };
  register_bulk({kUploadRaw, BM_UploadRaw});
  register_bulk({kUploadKp, BM_UploadKp});
  if (env.remote != nullptr) env.remote->RegisterUpload();
  register_bulk({kDownloadRaw, BM_DownloadRaw});
  register_bulk({kDownloadKp, BM_DownloadKp});
  if (env.remote != nullptr) env.remote->RegisterDownload();
  if (env.remote != nullptr && env.remote->gib_transfers()) {
    register_bulk({kUploadGiBKp, BM_UploadGiBKp});
    register_bulk({kDownloadGiBKp, BM_DownloadGiBKp});
    env.remote->RegisterGiBTransfers();
  }
  benchmark::RegisterBenchmark(saxpy_name.c_str(), BM_SaxpyKp)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMillisecond);
  const std::string mult_name = absl::StrCat("opmult_", c.saxpy_mb, "MiB/kp");
  benchmark::RegisterBenchmark(mult_name.c_str(), BM_MultKp)
      ->UseRealTime()
      ->MinTime(c.min_time_s)
      ->Unit(benchmark::kMillisecond);
  struct Named {
    const std::string* name;
    void (*fn)(benchmark::State&);
  };
  for (const Named& b :
       {Named{&saxpy_core, BM_SaxpyCore}, Named{&saxpy_core_unclamped, BM_SaxpyCoreUnclamped},
        Named{&saxpy_core_stoppable, BM_SaxpyCoreStoppable}, Named{&loop_core, BM_LoopCore},
        Named{&loop_core_stoppable, BM_LoopCoreStoppable}, Named{&loop16_core, BM_Loop16Core},
        Named{&loop16_core_stoppable, BM_Loop16CoreStoppable},
        Named{&saxpy_core_bounded, BM_SaxpyCoreBounded},
        Named{&loop_core_bounded, BM_LoopCoreBounded},
        Named{&loop16_core_bounded, BM_Loop16CoreBounded}}) {
    benchmark::RegisterBenchmark(b.name->c_str(), b.fn)
        ->UseRealTime()
        ->MinTime(c.min_time_s)
        ->Unit(benchmark::kMillisecond);
  }

  const bool color = isatty(STDOUT_FILENO) != 0;
  SummaryReporter reporter(color ? benchmark::ConsoleReporter::OO_ColorTabular
                                 : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  const bool met = PrintSummary(reporter, saxpy_name, saxpy_core, saxpy_core_unclamped,
                                saxpy_core_stoppable, saxpy_core_bounded);
  env.Teardown();
  g_env = nullptr;
  // This process's, and its daemons' (as their logs said; they are gone after Teardown).
  const uint64_t validation_errors =
      core::ValidationErrorCount() + komputed::test_support::DaemonProcess::ValidationErrors();
  if (validation_errors > 0) {
    std::cout << "Vulkan validation errors: " << validation_errors << "\n";
    return 1;
  }
  return (c.strict && !met) ? 1 : 0;
}
