#include "komputed/core/shader.h"

#include <cstring>
#include <shaderc/shaderc.hpp>
#include <spirv-tools/libspirv.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

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
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no built-in multiply for ", ElementTypeName(type), " elements"));
  }
}

std::array<uint64_t, 3> ShaderLocalSize(absl::Span<const uint32_t> spirv,
                                        absl::Span<const uint8_t> spec_constants,
                                        uint32_t spec_constant_size) {
  // Opcodes, decorations and execution modes of the SPIR-V specification.
  constexpr uint32_t kOpEntryPoint = 15, kOpExecutionMode = 16, kOpConstant = 43,
                     kOpConstantComposite = 44, kOpSpecConstant = 50, kOpSpecConstantComposite = 51,
                     kOpDecorate = 71, kOpExecutionModeId = 331;
  constexpr uint32_t kGLCompute = 5;
  constexpr uint32_t kDecorationSpecId = 1, kDecorationBuiltIn = 11, kBuiltInWorkgroupSize = 25;
  constexpr uint32_t kModeLocalSize = 17, kModeLocalSizeId = 38;

  // The entry point the pipeline uses ("main", GLCompute): only its execution modes count.
  uint32_t main_id = 0;
  for (size_t at = 5; at < spirv.size();) {
    const uint32_t words = spirv[at] >> 16, opcode = spirv[at] & 0xffff;
    if (words == 0 || at + words > spirv.size()) break;
    // "main" is the literal's first word; the second starts with its terminating NUL.
    if (opcode == kOpEntryPoint && words >= 5 && spirv[at + 1] == kGLCompute &&
        std::memcmp(&spirv[at + 3], "main", 4) == 0 && (spirv[at + 4] & 0xff) == 0) {
      main_id = spirv[at + 2];
    }
    at += words;
  }
  std::array<uint64_t, 3> literal = {1, 1, 1};
  std::array<uint32_t, 3> size_ids = {0, 0, 0};  // LocalSizeId's constants
  uint32_t workgroup_size_id = 0;                // the WorkgroupSize built-in's composite
  absl::flat_hash_map<uint32_t, uint32_t> spec_ids;
  absl::flat_hash_map<uint32_t, uint64_t> scalars;
  absl::flat_hash_map<uint32_t, std::array<uint32_t, 3>> composites;
  for (size_t at = 5; at < spirv.size();) {
    const uint32_t words = spirv[at] >> 16, opcode = spirv[at] & 0xffff;
    if (words == 0 || at + words > spirv.size()) break;
    const uint32_t* w = &spirv[at];
    const bool main_mode = (opcode == kOpExecutionMode || opcode == kOpExecutionModeId) &&
                           words >= 6 && w[1] == main_id;
    if (main_mode && w[2] == kModeLocalSize) {
      literal = {w[3], w[4], w[5]};
    } else if (main_mode && w[2] == kModeLocalSizeId) {
      size_ids = {w[3], w[4], w[5]};
    } else if (opcode == kOpDecorate && words >= 4 && w[2] == kDecorationBuiltIn &&
               w[3] == kBuiltInWorkgroupSize) {
      workgroup_size_id = w[1];
    } else if (opcode == kOpDecorate && words >= 4 && w[2] == kDecorationSpecId) {
      spec_ids[w[1]] = w[3];
    } else if ((opcode == kOpConstant || opcode == kOpSpecConstant) && words >= 4) {
      scalars[w[2]] = w[3];
    } else if ((opcode == kOpConstantComposite || opcode == kOpSpecConstantComposite) &&
               words >= 6) {
      composites[w[2]] = {w[3], w[4], w[5]};
    }
    at += words;
  }
  // A constant's value, with its specialization applied; one it cannot work out (the result of an
  // OpSpecConstantOp, say) counts as the largest there is, so that a bound errs on the safe side.
  auto value = [&](uint32_t id) -> uint64_t {
    if (auto spec = spec_ids.find(id); spec != spec_ids.end() && spec_constant_size >= 4) {
      const uint64_t offset = static_cast<uint64_t>(spec->second) * spec_constant_size;
      if (offset + 4 <= spec_constants.size()) {
        uint32_t v = 0;
        std::memcpy(&v, spec_constants.data() + offset, sizeof(v));
        return v;
      }
    }
    auto scalar = scalars.find(id);
    return scalar == scalars.end() ? uint64_t{UINT32_MAX} : scalar->second;
  };
  if (auto c = composites.find(workgroup_size_id);
      workgroup_size_id != 0 && c != composites.end()) {
    return {value(c->second[0]), value(c->second[1]), value(c->second[2])};
  }
  if (size_ids[0] != 0) return {value(size_ids[0]), value(size_ids[1]), value(size_ids[2])};
  return literal;
}

}  // namespace komputed::core
