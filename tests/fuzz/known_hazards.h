#pragma once
// Modules that Algorithm::Create does not refuse yet and that crash the driver (lavapipe) when
// they reach it. The fuzz targets keep them from Algorithm::Create, so that one known crash does
// not hide every other finding; with the environment variable KOMPUTED_FUZZ_HAZARDS=1 they let
// them through (to reproduce the crash, or to check the change that refuses them). Each check
// here is a finding (tests/fuzz/findings/README.md); remove it once Algorithm::Create refuses
// such modules itself.

#include <vulkan/vulkan_core.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/types/span.h"

namespace komputed::fuzz {

// What the module is built with.
struct HazardContext {
  size_t tensors = 0;  // bound at set 0, bindings 0 to tensors - 1
  absl::Span<const uint8_t> spec_constants;
  uint32_t spec_constant_size = 4;
  const VkPhysicalDeviceProperties* device = nullptr;
};

// What makes the module a known hazard; "" for none, and for a module that ValidateSpirv rejects
// for the device's Vulkan version (it never reaches the driver).
std::string KnownHazard(absl::Span<const uint32_t> spirv, const HazardContext& context);

}  // namespace komputed::fuzz
