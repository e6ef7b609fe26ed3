#pragma once
// Modules that Algorithm::Create does not refuse yet and that crash the driver (lavapipe) when
// they reach it. The fuzz targets keep them from Algorithm::Create, so that one known crash does
// not hide every other finding; with the environment variable KOMPUTED_FUZZ_HAZARDS=1 they let
// them through (to reproduce the crash, or to check the change that refuses them). Each check
// here is a finding (tests/fuzz/findings/README.md); remove it once Algorithm::Create refuses
// such modules itself.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/types/span.h"

namespace komputed::fuzz {

// What makes the module a known hazard with `tensors` tensors bound (set 0, bindings 0 to
// tensors - 1); "" for none, and for a module that ValidateSpirv rejects for the Vulkan version
// (it never reaches the driver).
std::string KnownHazard(absl::Span<const uint32_t> spirv, size_t tensors,
                        uint32_t vulkan_api_version);

}  // namespace komputed::fuzz
