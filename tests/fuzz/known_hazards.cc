#include "known_hazards.h"

#include <array>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "komputed/core/shader.h"

namespace komputed::fuzz {

std::string KnownHazard(absl::Span<const uint32_t> spirv, const HazardContext& context) {
  static const bool let_through = [] {
    const char* env = std::getenv("KOMPUTED_FUZZ_HAZARDS");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  if (let_through || !core::ValidateSpirv(spirv, context.device->apiVersion).ok()) return "";
  const size_t tensors = context.tensors;
  constexpr uint32_t kOpEntryPoint = 15, kOpDecorate = 71, kGLCompute = 5;
  constexpr uint32_t kDecorationBinding = 33, kDecorationDescriptorSet = 34;
  // Finding 4: the header's schema word (reserved, 0) is not checked by ValidateSpirv; lavapipe
  // refuses the module (VK_ERROR_UNKNOWN: INTERNAL).
  if (spirv.size() >= 5 && spirv[4] != 0) return absl::StrCat("schema word ", spirv[4]);
  bool has_main = false;
  for (size_t at = 5; at < spirv.size();) {
    const uint32_t words = spirv[at] >> 16, opcode = spirv[at] & 0xffff;
    if (words == 0 || at + words > spirv.size()) break;
    const uint32_t* w = &spirv[at];
    // Findings 1 and 2: a descriptor outside the pipeline layout (set 0, one storage buffer per
    // tensor) makes vkCreateComputePipelines read outside its tables.
    // Finding 3: vkCreateComputePipelines is given the entry point "main", which the module must
    // have (as a GLCompute entry point); lavapipe fails with VK_ERROR_UNKNOWN, others may crash.
    if (opcode == kOpEntryPoint && words >= 5 && w[1] == kGLCompute &&
        std::memcmp(&w[3], "main", 4) == 0 && (w[4] & 0xff) == 0) {
      has_main = true;
    }
    if (opcode == kOpDecorate && words >= 4 && w[2] == kDecorationDescriptorSet && w[3] != 0) {
      return absl::StrCat("descriptor set ", w[3]);
    }
    if (opcode == kOpDecorate && words >= 4 && w[2] == kDecorationBinding && w[3] >= tensors) {
      return absl::StrCat("binding ", w[3], " with ", tensors, " tensors bound");
    }
    at += words;
  }
  if (!has_main) return "no GLCompute entry point \"main\"";
  // Finding 5: the local size (specialization applied) is not checked against the device's
  // limits (the validation layers report it; lavapipe creates the pipeline).
  const std::array<uint64_t, 3> local =
      core::ShaderLocalSize(spirv, context.spec_constants, context.spec_constant_size);
  const VkPhysicalDeviceLimits& limits = context.device->limits;
  uint64_t invocations = 1;
  for (int d = 0; d < 3; ++d) {
    if (local[d] > limits.maxComputeWorkGroupSize[d]) {
      return absl::StrCat("local size ", local[d], " in dimension ", d);
    }
    invocations *= local[d];  // each factor is at most the limit: no overflow
  }
  if (invocations > limits.maxComputeWorkGroupInvocations) {
    return absl::StrCat("local size of ", invocations, " invocations");
  }
  return "";
}

}  // namespace komputed::fuzz
