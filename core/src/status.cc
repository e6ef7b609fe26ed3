#include "komputed/core/status.h"

#include "absl/strings/str_cat.h"

namespace komputed::core {

absl::string_view VkResultName(VkResult result) {
  switch (result) {
#define KD_CASE(r) \
  case r:          \
    return #r;
    KD_CASE(VK_SUCCESS)
    KD_CASE(VK_NOT_READY)
    KD_CASE(VK_TIMEOUT)
    KD_CASE(VK_EVENT_SET)
    KD_CASE(VK_EVENT_RESET)
    KD_CASE(VK_INCOMPLETE)
    KD_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    KD_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    KD_CASE(VK_ERROR_INITIALIZATION_FAILED)
    KD_CASE(VK_ERROR_DEVICE_LOST)
    KD_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    KD_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    KD_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    KD_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    KD_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    KD_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    KD_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    KD_CASE(VK_ERROR_FRAGMENTED_POOL)
    KD_CASE(VK_ERROR_UNKNOWN)
    KD_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    KD_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    KD_CASE(VK_ERROR_FRAGMENTATION)
    KD_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    KD_CASE(VK_ERROR_INVALID_SHADER_NV)
#undef KD_CASE
    default:
      return "VK_RESULT_UNKNOWN";
  }
}

absl::Status VkStatus(VkResult result, absl::string_view what) {
  if (result == VK_SUCCESS) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, " failed: ", VkResultName(result), " (", static_cast<int>(result), ")");
  switch (result) {
    case VK_ERROR_DEVICE_LOST:
      return absl::UnavailableError(message);
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_TOO_MANY_OBJECTS:
    case VK_ERROR_FRAGMENTED_POOL:
    case VK_ERROR_FRAGMENTATION:
      return absl::ResourceExhaustedError(message);
    case VK_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace komputed::core
