#include "komputed/core/shader.h"

#include <algorithm>
#include <shaderc/shaderc.hpp>
#include <spirv-tools/libspirv.hpp>
#include <spirv-tools/optimizer.hpp>

#include "absl/strings/str_cat.h"
#include "komputed/core/spirv_module.h"

namespace komputed::core {
namespace {

// Generated at build time by glslc from shaders/multiply.comp.
const uint32_t kMultiplyFloat[] =
#include "multiply_float.spv.inc"
    ;
const uint32_t kMultiplyInt[] =
#include "multiply_int.spv.inc"
    ;
const uint32_t kMultiplyUint[] =
#include "multiply_uint.spv.inc"
    ;
const uint32_t kMultiplyDouble[] =
#include "multiply_double.spv.inc"
    ;
const uint32_t kMultiplyInt16[] =
#include "multiply_int16.spv.inc"
    ;
const uint32_t kMultiplyUint16[] =
#include "multiply_uint16.spv.inc"
    ;
const uint32_t kMultiplyInt8[] =
#include "multiply_int8.spv.inc"
    ;
const uint32_t kMultiplyUint8[] =
#include "multiply_uint8.spv.inc"
    ;
const uint32_t kMultiplyFloat16[] =
#include "multiply_float16.spv.inc"
    ;

spv_target_env TargetFor(uint32_t api_version) {
  uint32_t minor = VK_API_VERSION_MINOR(api_version);
  if (minor >= 3) return SPV_ENV_VULKAN_1_3;
  if (minor == 2) return SPV_ENV_VULKAN_1_2;
  if (minor == 1) return SPV_ENV_VULKAN_1_1;
  return SPV_ENV_VULKAN_1_0;
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> CompileGlsl(absl::string_view source, absl::string_view name,
                                                  const std::vector<std::string>& defines) {
  shaderc::Compiler compiler;
  shaderc::CompileOptions options;
  options.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_1);
  for (const std::string& d : defines) {
    auto eq = d.find('=');
    if (eq == std::string::npos) {
      options.AddMacroDefinition(d);
    } else {
      options.AddMacroDefinition(d.substr(0, eq), d.substr(eq + 1));
    }
  }
  shaderc::SpvCompilationResult result = compiler.CompileGlslToSpv(
      source.data(), source.size(), shaderc_compute_shader, std::string(name).c_str(), options);
  if (result.GetCompilationStatus() != shaderc_compilation_status_success) {
    return absl::InvalidArgumentError(
        absl::StrCat("GLSL compilation failed: ", result.GetErrorMessage()));
  }
  return std::vector<uint32_t>(result.cbegin(), result.cend());
}

absl::Status ValidateSpirv(absl::Span<const uint32_t> spirv, uint32_t vulkan_api_version) {
  if (spirv.empty()) return absl::InvalidArgumentError("SPIR-V is empty");
  if (spirv[0] != 0x07230203u) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not SPIR-V: the first word is 0x", absl::Hex(spirv[0]), ", not the magic 0x07230203"));
  }
  // (SPIRV-Tools leaves the reserved schema word to the driver, which fails on it.)
  if (spirv.size() < 5 || spirv[4] != 0) {
    return absl::InvalidArgumentError(
        spirv.size() < 5 ? "SPIR-V shorter than its 5-word header"
                         : "invalid SPIR-V: the header's reserved schema word is not 0");
  }
  spvtools::SpirvTools tools(TargetFor(vulkan_api_version));
  std::string messages;
  tools.SetMessageConsumer(
      [&](spv_message_level_t, const char*, const spv_position_t& position, const char* message) {
        absl::StrAppend(&messages, messages.empty() ? "" : "; ", "word ", position.index, ": ",
                        message);
      });
  if (!tools.Validate(spirv.data(), spirv.size())) {
    return absl::InvalidArgumentError(absl::StrCat("invalid SPIR-V: ", messages));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ClampBufferAccesses(absl::Span<const uint32_t> spirv,
                                                          uint32_t vulkan_api_version) {
  spvtools::Optimizer optimizer(TargetFor(vulkan_api_version));
  std::string messages;
  optimizer.SetMessageConsumer(
      [&](spv_message_level_t, const char*, const spv_position_t&, const char* message) {
        absl::StrAppend(&messages, messages.empty() ? "" : "; ", message);
      });
  optimizer.RegisterPass(spvtools::CreateGraphicsRobustAccessPass());
  spvtools::OptimizerOptions options;
  options.set_run_validator(false);  // the caller validated it
  std::vector<uint32_t> clamped;
  if (!optimizer.Run(spirv.data(), spirv.size(), &clamped, options)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shader's buffer accesses cannot be bounded: ", messages));
  }
  return clamped;
}

absl::StatusOr<absl::Span<const uint32_t>> MultiplyShader(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return absl::MakeConstSpan(kMultiplyFloat);
    case ElementType::kInt32:
      return absl::MakeConstSpan(kMultiplyInt);
    case ElementType::kUInt32:
      return absl::MakeConstSpan(kMultiplyUint);
    case ElementType::kFloat64:
      return absl::MakeConstSpan(kMultiplyDouble);
    case ElementType::kInt16:
      return absl::MakeConstSpan(kMultiplyInt16);
    case ElementType::kUInt16:
      return absl::MakeConstSpan(kMultiplyUint16);
    case ElementType::kInt8:
      return absl::MakeConstSpan(kMultiplyInt8);
    case ElementType::kUInt8:
      return absl::MakeConstSpan(kMultiplyUint8);
    case ElementType::kFloat16:
      return absl::MakeConstSpan(kMultiplyFloat16);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no built-in multiply for ", ElementTypeName(type), " elements"));
  }
}

absl::StatusOr<std::array<uint32_t, 3>> MultiplyWorkgroup(uint64_t count) {
  constexpr uint64_t kMaxGroups = 65535;
  if (count == 0 || count > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("the built-in multiply takes 1 to ", UINT32_MAX, " elements, not ", count));
  }
  const uint64_t groups = (count + kMultiplyLocalSize - 1) / kMultiplyLocalSize;
  const uint64_t x = std::min(groups, kMaxGroups);
  const uint64_t rows = (groups + x - 1) / x;
  const uint64_t y = std::min(rows, kMaxGroups);
  const uint64_t z = (rows + y - 1) / y;  // 1 for any count below 2^32
  return std::array<uint32_t, 3>{static_cast<uint32_t>(x), static_cast<uint32_t>(y),
                                 static_cast<uint32_t>(z)};
}

std::array<uint64_t, 3> ShaderLocalSize(absl::Span<const uint32_t> spirv,
                                        absl::Span<const uint8_t> spec_constants,
                                        uint32_t spec_constant_size) {
  return SpirvModule::Parse(spirv).LocalSize({spec_constants, spec_constant_size});
}

}  // namespace komputed::core
