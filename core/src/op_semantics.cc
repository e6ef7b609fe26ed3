#include "komputed/core/op_semantics.h"

#include "absl/strings/str_cat.h"

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
  }
  return absl::OkStatus();
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
