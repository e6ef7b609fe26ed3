#pragma once

#include <vulkan/vulkan_core.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace komputed::core {

// The name of a VkResult ("VK_ERROR_DEVICE_LOST"), for messages.
absl::string_view VkResultName(VkResult result);

// Maps a failed VkResult onto a status: device loss → UNAVAILABLE, out of device or host memory →
// RESOURCE_EXHAUSTED, VK_TIMEOUT → DEADLINE_EXCEEDED, a missing feature or extension →
// FAILED_PRECONDITION, everything else → INTERNAL. `what` names the call that failed.
absl::Status VkStatus(VkResult result, absl::string_view what);

}  // namespace komputed::core

#define KD_STATUS_CONCAT_INNER(a, b) a##b
#define KD_STATUS_CONCAT(a, b) KD_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define KD_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status kd_status_ = (expr);      \
    if (!kd_status_.ok()) return kd_status_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error.
#define KD_ASSIGN_OR_RETURN(lhs, expr) \
  KD_ASSIGN_OR_RETURN_IMPL(KD_STATUS_CONCAT(kd_statusor_, __LINE__), lhs, expr)
#define KD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()

// Returns the status of a failed Vulkan call.
#define KD_VK_RETURN_IF_ERROR(call, what)                                                    \
  do {                                                                                       \
    VkResult kd_vk_result_ = (call);                                                         \
    if (kd_vk_result_ != VK_SUCCESS) return ::komputed::core::VkStatus(kd_vk_result_, what); \
  } while (0)
