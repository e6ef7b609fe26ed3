#pragma once
// What each operation of a sequence means, stated once: which tensors it takes, how it is
// validated, which host data moves before and after its submission, and how a dispatch's
// push-constant override behaves. Free of Vulkan and of the wire: the in-process core, the remote
// kp backend and the daemon each describe their tensors as TensorFacts and ask the functions here,
// so that the three cannot disagree.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "komputed/core/types.h"

namespace komputed::core {

enum class OpKind : uint8_t {
  kSyncDevice = 0,  // host data → device, for tensors with staging (OpTensorSyncDevice)
  kSyncLocal = 1,   // device → host data, for tensors with staging (OpTensorSyncLocal)
  kCopy = 2,        // tensors[0] → every other tensor (OpTensorCopy)
  kDispatch = 3,    // the algorithm's pipeline over its own tensors (OpAlgoDispatch, OpMult)
  kBarrier = 4,     // a buffer memory barrier per tensor (OpMemoryBarrier)
};
inline constexpr OpKind kLastOpKind = OpKind::kBarrier;

// Kompute's name of the operation, used in every error about it.
absl::string_view OpName(OpKind kind);
// The fewest tensors the operation takes (a dispatch takes its algorithm's, none of its own).
size_t MinTensors(OpKind kind);

// What the rules need to know of one tensor. `identity` tells tensors apart: the same object has
// the same identity in every description of it.
struct TensorFacts {
  const void* identity = nullptr;
  ElementType type = ElementType::kFloat32;
  uint32_t element_size = 0;
  uint64_t count = 0;
  MemoryType memory = MemoryType::kDevice;
  ImageShape image;  // an image's shape; all zeros for a buffer
};

// A memory barrier's masks, as Vulkan's VkAccessFlags and VkPipelineStageFlags values.
struct BarrierMasks {
  uint32_t src_access = 0;
  uint32_t dst_access = 0;
  uint32_t src_stage = 0;
  uint32_t dst_stage = 0;
  bool primary = true;  // the barrier is on each tensor's primary (device) buffer
};

// One recorded operation, as each layer holds it: T names a tensor and A an algorithm in that
// layer's terms (core objects, remote handles, kp objects).
template <typename T, typename A>
struct OpDesc {
  OpKind kind = OpKind::kSyncDevice;
  std::vector<T> tensors;
  A algorithm{};                                       // kDispatch only
  std::optional<std::vector<uint8_t>> push_constants;  // kDispatch only: an override
  BarrierMasks barrier;                                // kBarrier only
};

// An operation whose tensors and algorithm are named by handles (as the wire and the daemon's
// sessions name them).
using HandleOp = OpDesc<uint64_t, uint64_t>;

// The one validation of an operation's tensors, before anything is recorded: enough tensors, and
// for a copy, destinations of the source's element type and count that are not the source itself.
// INVALID_ARGUMENT naming the operation, the tensor (by its index) and the values at fault.
absl::Status ValidateOpTensors(OpKind kind, absl::Span<const TensorFacts> tensors);

// The barrier rule (Vulkan's "supported access types", VUID-vkCmdPipelineBarrier-srcAccessMask-
// 02815 and -dstAccessMask-02816): each stage mask is non-zero and names only stages of a compute
// queue (TOP_OF_PIPE, DRAW_INDIRECT, COMPUTE_SHADER, TRANSFER, BOTTOM_OF_PIPE, HOST,
// ALL_COMMANDS), and every bit of its access mask is supported by one of those stages:
// COMPUTE_SHADER ↔ SHADER_READ, SHADER_WRITE, UNIFORM_READ; DRAW_INDIRECT ↔
// INDIRECT_COMMAND_READ; TRANSFER ↔ TRANSFER_READ, TRANSFER_WRITE; HOST ↔ HOST_READ,
// HOST_WRITE; ALL_COMMANDS ↔ any of these; MEMORY_READ and MEMORY_WRITE with any stage;
// TOP_OF_PIPE and BOTTOM_OF_PIPE ↔ nothing else. INVALID_ARGUMENT naming the mask, the stage
// and the offending bits. (A barrier over no tensors records nothing: callers skip the check.)
absl::Status ValidateBarrierMasks(const BarrierMasks& masks);

// The push-constant size rule: values given for an algorithm (by SetPushConstants or a dispatch's
// override) must have the size that it was built with. INVALID_ARGUMENT otherwise.
absl::Status CheckPushConstantSize(size_t given_bytes, size_t built_bytes);

// The push-constant override rule: a dispatch records the values of its moment, which are its
// override when it has one (and the override then stays with the algorithm: later dispatches
// without one use it), else the algorithm's current values. `algorithm_values` is the algorithm's
// state, updated in place. On error nothing changes.
absl::StatusOr<std::vector<uint8_t>> ResolvePushConstants(
    const std::optional<std::vector<uint8_t>>& override_values,
    std::vector<uint8_t>& algorithm_values);

// Host steps around a submission, for a client that keeps tensors' host data apart from the
// device (the remote backend). A tensor that an operation touches (its own tensors, and a
// dispatch's algorithm's tensors) has its host data sent before the submission when it is
// host-coherent, or when it has staging and the operation is kSyncDevice; it is brought back
// after the submission when it is host-coherent, or has staging and the operation is kSyncLocal.
bool HostDataGoesUp(OpKind kind, MemoryType memory);
bool HostDataComesBack(OpKind kind, MemoryType memory);

// A copy's host step after the submission: the source's host data is copied into the host data of
// each destination that has staging (a host-coherent destination already holds the copy, and a
// storage tensor has no host data). Returns the destinations' indices; none when the source has
// no host data.
std::vector<size_t> CopyHostTargets(absl::Span<const TensorFacts> tensors);

}  // namespace komputed::core
