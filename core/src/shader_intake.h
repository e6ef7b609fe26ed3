#pragma once
// The checks of an untrusted shader against the algorithm that binds it and the device that runs
// it, made before anything reaches the driver (Algorithm::Build).

#include <cstdint>

#include "absl/status/statusor.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/spirv_module.h"

namespace komputed::core {

// What the pipeline needs from a shader that passed.
struct ShaderInterface {
  // The bytes of the pipeline layout's push-constant range: the larger of the shader's block
  // (rounded up to 4) and the algorithm's push constants. Dispatches push the algorithm's bytes
  // zero-padded to it.
  uint32_t push_constant_range = 0;
};

// Checks `module` (already valid SPIR-V) for `spec` on `device`:
//  - an entry point "main" of the GLCompute execution model;
//  - capabilities and extensions on an allow-list of what the device enabled; never physical
//    addressing, buffer device address, kernels, linkage or variable pointers;
//  - every descriptor the shader uses is in set 0 (set 1 is komputed's own), at a binding below
//    the number of tensors, and a single storage buffer, or for an image a single 2-D storage
//    image of the image's numeric kind and format qualifier (or none), on a device with
//    robustImageAccess (else FAILED_PRECONDITION);
//  - the local size (specialized) within maxComputeWorkGroupSize and
//    maxComputeWorkGroupInvocations;
//  - shared memory within maxComputeSharedMemorySize, and the push-constant block within
//    maxPushConstantsSize (RESOURCE_EXHAUSTED).
// Everything else is INVALID_ARGUMENT, with the thing at fault, its value and the limit.
absl::StatusOr<ShaderInterface> CheckShader(const SpirvModule& module, const AlgorithmSpec& spec,
                                            const Device& device);

}  // namespace komputed::core
