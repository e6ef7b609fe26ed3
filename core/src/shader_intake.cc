#include "shader_intake.h"

#include <algorithm>
#include <spirv/unified1/spirv.hpp11>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "komputed/core/status.h"

namespace komputed::core {
namespace {

using Cap = spv::Capability;

// A capability a compute shader may declare, when `enabled` says the device has what it needs
// (named by `feature`); always when `enabled` is null.
struct AllowedCapability {
  Cap capability;
  const char* name;
  const char* feature;
  bool (*enabled)(const ShaderFeatures&);
};

template <uint32_t kBit>
bool HasSubgroup(const ShaderFeatures& f) {
  return (f.subgroup_operations & kBit) != 0;
}

constexpr AllowedCapability kAllowed[] = {
    {Cap::Matrix, "Matrix", nullptr, nullptr},
    {Cap::Shader, "Shader", nullptr, nullptr},
    {Cap::DeviceGroup, "DeviceGroup", nullptr, nullptr},
    {Cap::Float16, "Float16", "shaderFloat16", [](const ShaderFeatures& f) { return f.float16; }},
    {Cap::Float64, "Float64", "shaderFloat64", [](const ShaderFeatures& f) { return f.float64; }},
    {Cap::Int8, "Int8", "shaderInt8", [](const ShaderFeatures& f) { return f.int8; }},
    {Cap::Int16, "Int16", "shaderInt16", [](const ShaderFeatures& f) { return f.int16; }},
    {Cap::Int64, "Int64", "shaderInt64", [](const ShaderFeatures& f) { return f.int64; }},
    {Cap::StorageBuffer8BitAccess, "StorageBuffer8BitAccess", "storageBuffer8BitAccess",
     [](const ShaderFeatures& f) { return f.storage_buffer_8bit; }},
    {Cap::StorageBuffer16BitAccess, "StorageBuffer16BitAccess", "storageBuffer16BitAccess",
     [](const ShaderFeatures& f) { return f.storage_buffer_16bit; }},
    // (Uniform buffers stay refused: CheckBindings admits storage buffers only.)
    {Cap::UniformAndStorageBuffer8BitAccess, "UniformAndStorageBuffer8BitAccess",
     "uniformAndStorageBuffer8BitAccess",
     [](const ShaderFeatures& f) { return f.uniform_and_storage_buffer_8bit; }},
    {Cap::UniformAndStorageBuffer16BitAccess, "UniformAndStorageBuffer16BitAccess",
     "uniformAndStorageBuffer16BitAccess",
     [](const ShaderFeatures& f) { return f.uniform_and_storage_buffer_16bit; }},
    {Cap::StoragePushConstant8, "StoragePushConstant8", "storagePushConstant8",
     [](const ShaderFeatures& f) { return f.push_constant_8bit; }},
    {Cap::StoragePushConstant16, "StoragePushConstant16", "storagePushConstant16",
     [](const ShaderFeatures& f) { return f.push_constant_16bit; }},
    {Cap::ImageQuery, "ImageQuery", nullptr, nullptr},
    {Cap::StorageImageExtendedFormats, "StorageImageExtendedFormats",
     "shaderStorageImageExtendedFormats",
     [](const ShaderFeatures& f) { return f.storage_image_extended_formats; }},
    {Cap::StorageImageReadWithoutFormat, "StorageImageReadWithoutFormat",
     "shaderStorageImageReadWithoutFormat",
     [](const ShaderFeatures& f) { return f.storage_image_read_without_format; }},
    {Cap::StorageImageWriteWithoutFormat, "StorageImageWriteWithoutFormat",
     "shaderStorageImageWriteWithoutFormat",
     [](const ShaderFeatures& f) { return f.storage_image_write_without_format; }},
    {Cap::GroupNonUniform, "GroupNonUniform", "subgroup operations (basic)",
     HasSubgroup<VK_SUBGROUP_FEATURE_BASIC_BIT>},
    {Cap::GroupNonUniformVote, "GroupNonUniformVote", "subgroup operations (vote)",
     HasSubgroup<VK_SUBGROUP_FEATURE_VOTE_BIT>},
    {Cap::GroupNonUniformArithmetic, "GroupNonUniformArithmetic",
     "subgroup operations (arithmetic)", HasSubgroup<VK_SUBGROUP_FEATURE_ARITHMETIC_BIT>},
    {Cap::GroupNonUniformBallot, "GroupNonUniformBallot", "subgroup operations (ballot)",
     HasSubgroup<VK_SUBGROUP_FEATURE_BALLOT_BIT>},
    {Cap::GroupNonUniformShuffle, "GroupNonUniformShuffle", "subgroup operations (shuffle)",
     HasSubgroup<VK_SUBGROUP_FEATURE_SHUFFLE_BIT>},
    {Cap::GroupNonUniformShuffleRelative, "GroupNonUniformShuffleRelative",
     "subgroup operations (shuffle relative)",
     HasSubgroup<VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT>},
    {Cap::GroupNonUniformClustered, "GroupNonUniformClustered", "subgroup operations (clustered)",
     HasSubgroup<VK_SUBGROUP_FEATURE_CLUSTERED_BIT>},
    {Cap::GroupNonUniformQuad, "GroupNonUniformQuad", "subgroup operations (quad)",
     HasSubgroup<VK_SUBGROUP_FEATURE_QUAD_BIT>},
};

// Capabilities that are refused whatever the device has, and why.
struct RefusedCapability {
  Cap capability;
  const char* name;
  const char* why;
};
constexpr RefusedCapability kRefused[] = {
    {Cap::Addresses, "Addresses", "physical addressing reaches memory that no buffer bounds"},
    {Cap::Kernel, "Kernel", "OpenCL kernels do not run in Vulkan pipelines"},
    {Cap::Linkage, "Linkage", "a module to link is no pipeline's shader"},
    {Cap::GenericPointer, "GenericPointer", "physical addressing"},
    {Cap::VariablePointers, "VariablePointers", "variable pointers defeat the bounds on accesses"},
    {Cap::VariablePointersStorageBuffer, "VariablePointersStorageBuffer",
     "variable pointers defeat the bounds on accesses"},
    {Cap::PhysicalStorageBufferAddresses, "PhysicalStorageBufferAddresses",
     "buffer device address: pointers that no descriptor bounds"},
    {Cap::Int64Atomics, "Int64Atomics", "shaderBufferInt64Atomics is not enabled"},
    {Cap::VulkanMemoryModel, "VulkanMemoryModel", "vulkanMemoryModel is not enabled"},
    {Cap::ShaderNonUniform, "ShaderNonUniform", "descriptor indexing is not enabled"},
    {Cap::RuntimeDescriptorArray, "RuntimeDescriptorArray", "descriptor indexing is not enabled"},
};

// SPIR-V extensions a compute shader may use: always, or when `enabled` says the device has what
// they need. Others are refused: physical storage buffers and variable pointers whatever the
// device has, the rest because nothing enables them.
struct AllowedExtension {
  const char* name;
  bool (*enabled)(const ShaderFeatures&);
};
constexpr AllowedExtension kAllowedExtensions[] = {
    {"SPV_KHR_storage_buffer_storage_class", nullptr},
    {"SPV_KHR_device_group", nullptr},
    {"SPV_KHR_non_semantic_info", nullptr},
    {"SPV_GOOGLE_decorate_string", nullptr},
    {"SPV_GOOGLE_hlsl_functionality1", nullptr},
    {"SPV_GOOGLE_user_type", nullptr},
    {"SPV_KHR_8bit_storage",
     [](const ShaderFeatures& f) {
       return f.storage_buffer_8bit || f.uniform_and_storage_buffer_8bit || f.push_constant_8bit;
     }},
    {"SPV_KHR_16bit_storage",
     [](const ShaderFeatures& f) {
       return f.storage_buffer_16bit || f.uniform_and_storage_buffer_16bit || f.push_constant_16bit;
     }},
};

std::string DeviceName(const Device& device) {
  return absl::StrCat("device ", device.info().index, " (", device.properties().deviceName, ")");
}

std::string ExecutionModelName(uint32_t model) {
  switch (static_cast<spv::ExecutionModel>(model)) {
    case spv::ExecutionModel::Vertex:
      return "Vertex";
    case spv::ExecutionModel::Fragment:
      return "Fragment";
    case spv::ExecutionModel::GLCompute:
      return "GLCompute";
    case spv::ExecutionModel::Kernel:
      return "Kernel";
    default:
      return absl::StrCat("execution model ", model);
  }
}

// "the shader's storage buffer B (set 0, binding 3)"
std::string BindingName(const SpirvBinding& b) {
  return absl::StrCat("the shader's ", DescriptorKindName(b.kind),
                      b.name.empty() ? "" : absl::StrCat(" '", b.name, "'"), " (set ", b.set,
                      ", binding ", b.binding, ")");
}

absl::Status CheckCapabilities(const SpirvModule& module, const Device& device) {
  const ShaderFeatures& features = device.shader_features();
  // Capabilities whose features the device did not enable: all of them are named at once.
  std::vector<std::string> disabled;
  std::vector<std::string> needed;
  for (uint32_t c : module.capabilities()) {
    const auto* allowed =
        std::find_if(std::begin(kAllowed), std::end(kAllowed),
                     [&](const auto& a) { return static_cast<uint32_t>(a.capability) == c; });
    if (allowed != std::end(kAllowed)) {
      if (allowed->enabled == nullptr || allowed->enabled(features)) continue;
      disabled.push_back(absl::StrCat(allowed->name, " (", c, ")"));
      if (std::find(needed.begin(), needed.end(), allowed->feature) == needed.end()) {
        needed.push_back(allowed->feature);
      }
      continue;
    }
    const auto* refused =
        std::find_if(std::begin(kRefused), std::end(kRefused),
                     [&](const auto& r) { return static_cast<uint32_t>(r.capability) == c; });
    if (refused != std::end(kRefused)) {
      return absl::InvalidArgumentError(absl::StrCat("the shader declares capability ",
                                                     refused->name, " (", c,
                                                     "), which is not allowed: ", refused->why));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the shader declares capability ", c, ", which is not allowed for compute shaders on ",
        DeviceName(device),
        " (allowed: Shader, Matrix, DeviceGroup, and where the device enables them the 8/16/64-bit "
        "types, 8/16-bit storage-buffer and push-constant access and subgroup operations)"));
  }
  if (!disabled.empty()) {
    const bool one = needed.size() == 1;
    return absl::InvalidArgumentError(
        absl::StrCat("the shader declares ", disabled.size() == 1 ? "capability " : "capabilities ",
                     absl::StrJoin(disabled, ", "), ", which ",
                     disabled.size() == 1 ? "needs " : "need ", absl::StrJoin(needed, ", "), ": ",
                     DeviceName(device), " does not have ", one ? "it" : "them", " enabled"));
  }
  for (const std::string& e : module.extensions()) {
    const auto* allowed = std::find_if(std::begin(kAllowedExtensions), std::end(kAllowedExtensions),
                                       [&](const auto& a) { return e == a.name; });
    if (allowed != std::end(kAllowedExtensions) &&
        (allowed->enabled == nullptr || allowed->enabled(features))) {
      continue;
    }
    std::string why = "nothing enables it on " + DeviceName(device);
    if (absl::StrContains(e, "physical_storage_buffer")) {
      why = "buffer device address: pointers that no descriptor bounds";
    } else if (e == "SPV_KHR_variable_pointers") {
      why = "variable pointers defeat the bounds on accesses";
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the shader uses SPIR-V extension ", e, ", which is not allowed: ", why));
  }
  for (const std::string& set : module.ext_inst_imports()) {
    if (set == "GLSL.std.450" || absl::StartsWith(set, "NonSemantic.")) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("the shader imports extended instruction set ", set,
                     ", which is not allowed (GLSL.std.450 and NonSemantic.* are)"));
  }
  if (module.addressing_model() != static_cast<uint32_t>(spv::AddressingModel::Logical)) {
    return absl::InvalidArgumentError(absl::StrCat("the shader's addressing model is ",
                                                   module.addressing_model(),
                                                   "; only Logical (0) is allowed"));
  }
  if (module.uses_physical_storage_buffer()) {
    return absl::InvalidArgumentError(
        "the shader declares PhysicalStorageBuffer pointers (buffer device address), which are "
        "not allowed: no descriptor bounds them");
  }
  return absl::OkStatus();
}

// The GLSL format qualifier of an image of `channels` elements of `type` (none for 3 channels).
spv::ImageFormat SpirvImageFormat(ElementType type, uint32_t channels) {
  using F = spv::ImageFormat;
  static constexpr F kFormats[][3] = {
      {F::R8i, F::Rg8i, F::Rgba8i},       {F::R8ui, F::Rg8ui, F::Rgba8ui},
      {F::R16i, F::Rg16i, F::Rgba16i},    {F::R16ui, F::Rg16ui, F::Rgba16ui},
      {F::R16f, F::Rg16f, F::Rgba16f},    {F::R32i, F::Rg32i, F::Rgba32i},
      {F::R32ui, F::Rg32ui, F::Rgba32ui}, {F::R32f, F::Rg32f, F::Rgba32f},
  };
  const int column = channels == 1 ? 0 : channels == 2 ? 1 : channels == 4 ? 2 : -1;
  const int row = ImageElementIndex(type);
  return row < 0 || column < 0 ? F::Unknown : kFormats[row][column];
}

// A storage image binding against the image bound there: a single 2-D, non-arrayed,
// single-sampled storage image, of a format qualifier that is the image's (or none) and of the
// image's numeric kind.
absl::Status CheckImageBinding(const SpirvBinding& b, const Tensor& image, const Device& device) {
  const ImageShape& shape = image.image_shape();
  const std::string what =
      absl::StrCat(BindingName(b), ", bound to an image of ", shape.width, "x", shape.height, "x",
                   shape.channels, " ", ElementTypeName(image.element_type()));
  if (b.kind != DescriptorKind::kImage) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ", is no image: declare it `uniform image2D` (iimage2D, uimage2D) "
                     "with the image's format qualifier"));
  }
  if (b.image.sampled != 2 || b.image.dim != static_cast<uint32_t>(spv::Dim::Dim2D) ||
      b.image.arrayed != 0 || b.image.multisampled != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ", is not a plain 2-D storage image (dim ", b.image.dim, ", arrayed ",
                     b.image.arrayed, ", multisampled ", b.image.multisampled, ", sampled ",
                     b.image.sampled, "): images bind as `uniform image2D`, with no sampler"));
  }
  if (b.descriptor_count != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ", is an array of images; each binding holds one image"));
  }
  const ElementType type = image.element_type();
  using Component = SpirvBinding::ImageType::Component;
  const Component expected =
      (type == ElementType::kFloat32 || type == ElementType::kFloat16) ? Component::kFloat
      : (type == ElementType::kInt8 || type == ElementType::kInt16 || type == ElementType::kInt32)
          ? Component::kSigned
          : Component::kUnsigned;
  if (b.image.component != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ", reads ",
                     b.image.component == Component::kFloat      ? "floats (image2D)"
                     : b.image.component == Component::kSigned   ? "signed integers (iimage2D)"
                     : b.image.component == Component::kUnsigned ? "unsigned integers (uimage2D)"
                                                                 : "an unknown type",
                     " but the image holds ", ElementTypeName(type), ": declare it ",
                     expected == Component::kFloat    ? "image2D"
                     : expected == Component::kSigned ? "iimage2D"
                                                      : "uimage2D"));
  }
  const spv::ImageFormat format = SpirvImageFormat(type, shape.channels);
  if (b.image.format != 0 && b.image.format != static_cast<uint32_t>(format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ", has format qualifier ", b.image.format, " (spv::ImageFormat) but the image's is ",
        format == spv::ImageFormat::Unknown
            ? std::string("none (3 channels: declare no format qualifier)")
            : absl::StrCat(static_cast<uint32_t>(format)),
        "; give the image's format or none"));
  }
  if (!device.robust_image_access()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", DeviceName(device),
        " lacks robustImageAccess, without which an image access out of bounds is undefined; "
        "images cannot be bound to shaders on it"));
  }
  return absl::OkStatus();
}

absl::Status CheckBindings(const SpirvModule& module, const AlgorithmSpec& spec,
                           const Device& device) {
  const size_t n = spec.tensors.size();
  for (const SpirvBinding& b : module.bindings()) {
    if (!b.used) continue;
    if (b.set != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          BindingName(b), " is in descriptor set ", b.set, ": the algorithm's tensors are set 0",
          b.set == 1 ? "; set 1 is reserved for komputed's own use" : ""));
    }
    if (b.binding < n && spec.tensors[b.binding] != nullptr &&
        spec.tensors[b.binding]->is_image()) {
      KD_RETURN_IF_ERROR(CheckImageBinding(b, *spec.tensors[b.binding], device));
      continue;
    }
    if (b.kind != DescriptorKind::kStorageBuffer) {
      return absl::InvalidArgumentError(absl::StrCat(
          BindingName(b), " has no descriptor: the algorithm's tensors are storage buffers ",
          "(GLSL: declare it `buffer`, not `uniform`) and its images storage images, and nothing "
          "else is bound"));
    }
    if (b.descriptor_count != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          BindingName(b), " is an array of ",
          b.descriptor_count == 0 ? std::string("any number of") : absl::StrCat(b.descriptor_count),
          " buffers; each binding holds one tensor"));
    }
    if (b.binding >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(BindingName(b), " has no tensor: the algorithm has ", n, " tensor(s)",
                       n == 0 ? "" : absl::StrCat(", at bindings 0..", n - 1)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLocalSize(const SpirvModule& module, const SpecConstants& constants,
                            const Device& device) {
  const VkPhysicalDeviceLimits& limits = device.limits();
  const std::array<uint64_t, 3> local = module.LocalSize(constants);
  uint64_t invocations = 1;
  for (int d = 0; d < 3; ++d) {
    const std::string axis(1, "xyz"[d]);
    if (local[d] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shader's local size ", axis, "=0: every dimension must be at least 1"));
    }
    if (local[d] > limits.maxComputeWorkGroupSize[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shader's local size ", axis, "=", local[d],
                       local[d] == UINT32_MAX ? " (or a value its constants do not determine)" : "",
                       " is over the device's maxComputeWorkGroupSize ", axis, " (",
                       limits.maxComputeWorkGroupSize[d], ")"));
    }
    invocations *= local[d];  // each factor is at most a 32-bit limit
  }
  if (invocations > limits.maxComputeWorkGroupInvocations) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shader's local size ", local[0], "x", local[1], "x", local[2], " = ", invocations,
        " invocations per workgroup is over the device's maxComputeWorkGroupInvocations (",
        limits.maxComputeWorkGroupInvocations, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShaderInterface> CheckShader(const SpirvModule& module, const AlgorithmSpec& spec,
                                            const Device& device) {
  if (module.ComputeMain() == nullptr) {
    std::vector<std::string> found;
    for (const SpirvEntryPoint& e : module.entry_points()) {
      found.push_back(absl::StrCat("'", e.name, "' (", ExecutionModelName(e.execution_model), ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the shader has no GLCompute entry point named 'main'; its entry points: ",
                     found.empty() ? "none" : absl::StrJoin(found, ", ")));
  }
  if (absl::Status s = CheckCapabilities(module, device); !s.ok()) return s;
  if (absl::Status s = CheckBindings(module, spec, device); !s.ok()) return s;
  const SpecConstants constants{spec.spec_constants, spec.spec_constant_size};
  if (absl::Status s = CheckLocalSize(module, constants, device); !s.ok()) return s;

  const VkPhysicalDeviceLimits& limits = device.limits();
  const uint64_t shared = module.SharedMemoryBytes(constants);
  if (shared > limits.maxComputeSharedMemorySize) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the shader's shared (Workgroup) variables take ",
                     shared == SpirvModule::kUnknown ? std::string("an undetermined number of")
                                                     : absl::StrCat(shared),
                     " bytes, over the device's maxComputeSharedMemorySize (",
                     limits.maxComputeSharedMemorySize, " bytes)"));
  }
  const uint64_t block = module.PushConstantBytes(constants);
  if (block > limits.maxPushConstantsSize) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the shader's push-constant block spans ",
                     block == SpirvModule::kUnknown ? std::string("an undetermined number of")
                                                    : absl::StrCat(block),
                     " bytes, over the device's maxPushConstantsSize (",
                     limits.maxPushConstantsSize, " bytes)"));
  }
  ShaderInterface out;
  out.push_constant_range =
      static_cast<uint32_t>(std::max<uint64_t>((block + 3) / 4 * 4, spec.push_constants.size()));
  return out;
}

}  // namespace komputed::core
