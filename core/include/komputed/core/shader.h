#pragma once

#include <array>
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

// Rewrites a valid module so that every indexed access into a buffer, an array or a vector
// (access chains) is clamped into its bounds, runtime arrays by their buffer's length
// (SPIRV-Tools' graphics robust-access pass): a shader cannot reach memory outside the buffers
// bound to it. INVALID_ARGUMENT with the pass's messages where it cannot (variable pointers, a
// non-logical addressing model). Thread-safe.
absl::StatusOr<std::vector<uint32_t>> ClampBufferAccesses(absl::Span<const uint32_t> spirv,
                                                          uint32_t vulkan_api_version);

// The local size (invocations per workgroup in x, y, z) of a compute shader's entry point "main"
// (SpirvModule::LocalSize): its WorkgroupSize built-in constant when it has one (specialization
// constants taken from `spec_constants`, by SpecId, at `spec_constant_size` bytes each), else
// main's LocalSizeId or LocalSize execution mode; {1, 1, 1} for a module that declares none. A
// component it cannot work out (an unsupported OpSpecConstantOp) counts as UINT32_MAX. Reads any
// words without faulting (a malformed module gives some size; validation rejects it).
std::array<uint64_t, 3> ShaderLocalSize(absl::Span<const uint32_t> spirv,
                                        absl::Span<const uint8_t> spec_constants,
                                        uint32_t spec_constant_size);

// The built-in element-wise multiply shader (c[i] = a[i] * b[i]) for an element type: kFloat32,
// kInt32, kUInt32, kFloat64, kInt16, kUInt16, kInt8, kUInt8 or kFloat16; INVALID_ARGUMENT for
// others. Integer products wrap (the low bits of the exact product). The 8- and 16-bit elements
// are only loaded and stored, and multiplied as 32-bit values, so the shaders need the storage
// features alone: storageBuffer8BitAccess (int8, uint8) or storageBuffer16BitAccess (int16,
// uint16, float16), and shaderFloat64 for kFloat64. float16's product is computed exactly in
// float and rounded to the nearest binary16, ties to even (overflow to infinity, NaN stays NaN),
// with integer operations, the same on every device. Its workgroups have kMultiplyLocalSize
// invocations; dispatch it with MultiplyWorkgroup(count).
absl::StatusOr<absl::Span<const uint32_t>> MultiplyShader(ElementType type);

inline constexpr uint32_t kMultiplyLocalSize = 256;

// The workgroups (x, y, z) that cover `count` elements with the multiply shader, each at most
// 65535 (Vulkan's least maxComputeWorkGroupCount, so any device takes them), filling x first:
// {1, 1, 1} up to 64 elements, {65535, 1, 1} up to 65535 × 64, then rows of 65535 in y and z.
// INVALID_ARGUMENT for 0 elements or more than a 32-bit index reaches.
absl::StatusOr<std::array<uint32_t, 3>> MultiplyWorkgroup(uint64_t count);

}  // namespace komputed::core
