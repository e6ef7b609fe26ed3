#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

// Compiles a GLSL compute shader to SPIR-V with shaderc. INVALID_ARGUMENT carries the compiler's
// messages (with line numbers). `name` appears in them. Thread-safe.
absl::StatusOr<std::vector<uint32_t>> CompileGlsl(absl::string_view source,
                                                  absl::string_view name = "shader",
                                                  const std::vector<std::string>& defines = {});

// Validates SPIR-V for a Vulkan version (VK_API_VERSION_1_x) with SPIRV-Tools. INVALID_ARGUMENT
// carries the validator's message.
absl::Status ValidateSpirv(absl::Span<const uint32_t> spirv, uint32_t vulkan_api_version);

// The built-in element-wise multiply shader (c[i] = a[i] * b[i]) for an element type: kFloat32,
// kInt32, kUInt32 or kFloat64; INVALID_ARGUMENT for others.
absl::StatusOr<absl::Span<const uint32_t>> MultiplyShader(ElementType type);

}  // namespace komputed::core
