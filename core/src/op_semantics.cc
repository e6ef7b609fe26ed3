#include "komputed/core/op_semantics.h"

#include <vulkan/vulkan_core.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace komputed::core {

absl::string_view OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kSyncDevice:
      return "OpTensorSyncDevice";
    case OpKind::kSyncLocal:
      return "OpTensorSyncLocal";
    case OpKind::kCopy:
      return "OpTensorCopy";
    case OpKind::kDispatch:
      return "OpAlgoDispatch";
    case OpKind::kBarrier:
      return "OpMemoryBarrier";
  }
  return "an unknown operation";
}

size_t MinTensors(OpKind kind) {
  switch (kind) {
    case OpKind::kSyncDevice:
    case OpKind::kSyncLocal:
      return 1;
    case OpKind::kCopy:
      return 2;
    case OpKind::kDispatch:
    case OpKind::kBarrier:
      return 0;
  }
  return 0;
}

absl::Status ValidateOpTensors(OpKind kind, absl::Span<const TensorFacts> tensors) {
  const absl::string_view op = OpName(kind);
  if (static_cast<uint8_t>(kind) > static_cast<uint8_t>(kLastOpKind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown operation kind ", static_cast<int>(kind)));
  }
  if (tensors.size() < MinTensors(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " needs at least ", MinTensors(kind), " tensor(s), got ", tensors.size()));
  }
  if (kind != OpKind::kCopy) return absl::OkStatus();
  const TensorFacts& src = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    const TensorFacts& dst = tensors[i];
    if (dst.identity == src.identity) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " is the source (tensor 0) itself"));
    }
    if (dst.type != src.type || dst.element_size != src.element_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": tensor ", i, " holds ", ElementTypeName(dst.type), " elements of ",
                       dst.element_size, " bytes but the source (tensor 0) holds ",
                       ElementTypeName(src.type), " elements of ", src.element_size, " bytes"));
    }
    if (dst.count != src.count) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": tensor ", i, " has ", dst.count,
                                                     " elements but the source (tensor 0) has ",
                                                     src.count));
    }
    if (src.image.is_image() && dst.image.is_image() && !(src.image == dst.image)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": image ", i, " is ", dst.image.width, "x", dst.image.height, "x",
          dst.image.channels, " but the source image (0) is ", src.image.width, "x",
          src.image.height, "x", src.image.channels, "; images copy whole, to the same shape"));
    }
  }
  return absl::OkStatus();
}

namespace {

struct Flag {
  uint32_t bit;
  const char* name;
};

constexpr Flag kStages[] = {
    {VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, "TOP_OF_PIPE"},
    {VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, "DRAW_INDIRECT"},
    {VK_PIPELINE_STAGE_VERTEX_INPUT_BIT, "VERTEX_INPUT"},
    {VK_PIPELINE_STAGE_VERTEX_SHADER_BIT, "VERTEX_SHADER"},
    {VK_PIPELINE_STAGE_TESSELLATION_CONTROL_SHADER_BIT, "TESSELLATION_CONTROL_SHADER"},
    {VK_PIPELINE_STAGE_TESSELLATION_EVALUATION_SHADER_BIT, "TESSELLATION_EVALUATION_SHADER"},
    {VK_PIPELINE_STAGE_GEOMETRY_SHADER_BIT, "GEOMETRY_SHADER"},
    {VK_PIPELINE_STAGE_FRAGMENT_SHADER_BIT, "FRAGMENT_SHADER"},
    {VK_PIPELINE_STAGE_EARLY_FRAGMENT_TESTS_BIT, "EARLY_FRAGMENT_TESTS"},
    {VK_PIPELINE_STAGE_LATE_FRAGMENT_TESTS_BIT, "LATE_FRAGMENT_TESTS"},
    {VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT, "COLOR_ATTACHMENT_OUTPUT"},
    {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, "COMPUTE_SHADER"},
    {VK_PIPELINE_STAGE_TRANSFER_BIT, "TRANSFER"},
    {VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, "BOTTOM_OF_PIPE"},
    {VK_PIPELINE_STAGE_HOST_BIT, "HOST"},
    {VK_PIPELINE_STAGE_ALL_GRAPHICS_BIT, "ALL_GRAPHICS"},
    {VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, "ALL_COMMANDS"},
};

constexpr Flag kAccesses[] = {
    {VK_ACCESS_INDIRECT_COMMAND_READ_BIT, "INDIRECT_COMMAND_READ"},
    {VK_ACCESS_INDEX_READ_BIT, "INDEX_READ"},
    {VK_ACCESS_VERTEX_ATTRIBUTE_READ_BIT, "VERTEX_ATTRIBUTE_READ"},
    {VK_ACCESS_UNIFORM_READ_BIT, "UNIFORM_READ"},
    {VK_ACCESS_INPUT_ATTACHMENT_READ_BIT, "INPUT_ATTACHMENT_READ"},
    {VK_ACCESS_SHADER_READ_BIT, "SHADER_READ"},
    {VK_ACCESS_SHADER_WRITE_BIT, "SHADER_WRITE"},
    {VK_ACCESS_COLOR_ATTACHMENT_READ_BIT, "COLOR_ATTACHMENT_READ"},
    {VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT, "COLOR_ATTACHMENT_WRITE"},
    {VK_ACCESS_DEPTH_STENCIL_ATTACHMENT_READ_BIT, "DEPTH_STENCIL_ATTACHMENT_READ"},
    {VK_ACCESS_DEPTH_STENCIL_ATTACHMENT_WRITE_BIT, "DEPTH_STENCIL_ATTACHMENT_WRITE"},
    {VK_ACCESS_TRANSFER_READ_BIT, "TRANSFER_READ"},
    {VK_ACCESS_TRANSFER_WRITE_BIT, "TRANSFER_WRITE"},
    {VK_ACCESS_HOST_READ_BIT, "HOST_READ"},
    {VK_ACCESS_HOST_WRITE_BIT, "HOST_WRITE"},
    {VK_ACCESS_MEMORY_READ_BIT, "MEMORY_READ"},
    {VK_ACCESS_MEMORY_WRITE_BIT, "MEMORY_WRITE"},
};

// The stages of a compute queue, and the accesses each supports.
struct StageAccess {
  uint32_t stage;
  uint32_t accesses;
};
constexpr uint32_t kAnyStageAccess = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
constexpr StageAccess kComputeQueueStages[] = {
    {VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, 0},
    {VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT},
    {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
     VK_ACCESS_UNIFORM_READ_BIT | VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT},
    {VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT},
    {VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, 0},
    {VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT},
    {VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
     VK_ACCESS_INDIRECT_COMMAND_READ_BIT | VK_ACCESS_UNIFORM_READ_BIT | VK_ACCESS_SHADER_READ_BIT |
         VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
         VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT},
};

// "0x20 (SHADER_READ|SHADER_WRITE)"; bits without a name appear as numbers.
template <size_t N>
std::string FlagNames(uint32_t mask, const Flag (&names)[N]) {
  std::vector<std::string> parts;
  uint32_t rest = mask;
  for (const Flag& f : names) {
    if ((mask & f.bit) != 0) {
      parts.push_back(f.name);
      rest &= ~f.bit;
    }
  }
  if (rest != 0) parts.push_back(absl::StrCat("0x", absl::Hex(rest)));
  return absl::StrCat("0x", absl::Hex(mask), " (",
                      parts.empty() ? "none" : absl::StrJoin(parts, "|"), ")");
}

absl::Status ValidateBarrierSide(absl::string_view side, uint32_t stage, uint32_t access) {
  const absl::string_view op = OpName(OpKind::kBarrier);
  if (stage == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", side, "StageMask is 0; it must name at least one stage"));
  }
  uint32_t queue_stages = 0, supported = kAnyStageAccess;
  for (const StageAccess& s : kComputeQueueStages) {
    queue_stages |= s.stage;
    if ((stage & s.stage) != 0) supported |= s.accesses;
  }
  if (uint32_t other = stage & ~queue_stages; other != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", side, "StageMask ", FlagNames(stage, kStages), " has bits ",
        FlagNames(other, kStages),
        " that are not stages of a compute queue (TOP_OF_PIPE, DRAW_INDIRECT, COMPUTE_SHADER, "
        "TRANSFER, BOTTOM_OF_PIPE, HOST, ALL_COMMANDS)"));
  }
  if (uint32_t other = access & ~supported; other != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", side, "AccessMask ", FlagNames(access, kAccesses), " has bits ",
        FlagNames(other, kAccesses), " that no stage of ", side, "StageMask ",
        FlagNames(stage, kStages),
        " supports (COMPUTE_SHADER: SHADER_READ, SHADER_WRITE, UNIFORM_READ; TRANSFER: "
        "TRANSFER_READ, TRANSFER_WRITE; HOST: HOST_READ, HOST_WRITE; DRAW_INDIRECT: "
        "INDIRECT_COMMAND_READ; ALL_COMMANDS: any of them; MEMORY_READ, MEMORY_WRITE: any stage)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBarrierMasks(const BarrierMasks& masks) {
  if (absl::Status s = ValidateBarrierSide("src", masks.src_stage, masks.src_access); !s.ok()) {
    return s;
  }
  return ValidateBarrierSide("dst", masks.dst_stage, masks.dst_access);
}

absl::Status CheckPushConstantSize(size_t given_bytes, size_t built_bytes) {
  if (given_bytes == built_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("push constants of ", given_bytes,
                                                 " bytes given; the algorithm was built with ",
                                                 built_bytes, " bytes"));
}

absl::StatusOr<std::vector<uint8_t>> ResolvePushConstants(
    const std::optional<std::vector<uint8_t>>& override_values,
    std::vector<uint8_t>& algorithm_values) {
  if (!override_values.has_value()) return algorithm_values;
  if (absl::Status s = CheckPushConstantSize(override_values->size(), algorithm_values.size());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(OpKind::kDispatch), ": ", s.message()));
  }
  algorithm_values = *override_values;
  return algorithm_values;
}

bool HostDataGoesUp(OpKind kind, MemoryType memory) {
  return IsHostCoherent(memory) || (HasStaging(memory) && kind == OpKind::kSyncDevice);
}

bool HostDataComesBack(OpKind kind, MemoryType memory) {
  return IsHostCoherent(memory) || (HasStaging(memory) && kind == OpKind::kSyncLocal);
}

std::vector<size_t> CopyHostTargets(absl::Span<const TensorFacts> tensors) {
  std::vector<size_t> targets;
  if (tensors.empty() || !HasHostData(tensors[0].memory)) return targets;
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (HasStaging(tensors[i].memory)) targets.push_back(i);
  }
  return targets;
}

}  // namespace komputed::core
