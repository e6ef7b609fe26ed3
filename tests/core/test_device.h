#pragma once
// What the core tests share beyond the status matchers: the device they run on, the bound on every
// wait, and the shaders that several suites dispatch.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "komputed/core/device.h"
#include "komputed/core/types.h"
#include "komputed/core/vulkan_calls.h"

namespace komputed::core {

// The bound on every wait in the core tests: a hang fails its test instead of the whole run.
inline constexpr absl::Duration kTimeout = absl::Seconds(60);

// The device of the core tests (core's default choice), made once for the test program. Without
// one nothing can run: the program stops with the reason rather than crashing later.
inline std::shared_ptr<Device> TestDevice() {
  static const std::shared_ptr<Device>* device = [] {
    absl::StatusOr<std::shared_ptr<Device>> d = Device::Create({});
    if (!d.ok()) {
      std::fprintf(stderr, "core_test needs a Vulkan device: %s\n", d.status().ToString().c_str());
      std::exit(1);
    }
    return new std::shared_ptr<Device>(*std::move(d));
  }();
  return *device;
}

// A device of its own (faults must not leak into other tests) whose calls can fail.
struct FaultyDevice {
  std::shared_ptr<FaultInjectingCalls> calls;
  std::shared_ptr<Device> device;
};

// map_device_memory false: device tensors need a one-off submission, as on a GPU whose device
// memory the host cannot map.
inline absl::StatusOr<FaultyDevice> MakeFaultyDevice(bool map_device_memory = false) {
  FaultyDevice f;
  f.calls = std::make_shared<FaultInjectingCalls>();
  DeviceOptions options;
  options.calls = f.calls;
  options.map_device_memory = map_device_memory;
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Create(options);
  if (!device.ok()) return device.status();
  f.device = *device;
  return f;
}

// Every element type that the built-in multiply (MultiplyShader) takes.
inline constexpr ElementType kMultiplyTypes[] = {
    ElementType::kFloat32, ElementType::kInt32, ElementType::kUInt32,
    ElementType::kFloat64, ElementType::kInt16, ElementType::kUInt16,
    ElementType::kInt8,    ElementType::kUInt8, ElementType::kFloat16};

// b[i] += a[i]
inline constexpr char kAddShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] += a[i];
}
)";

// b[i] = a[i] * scale + offset, from push constants.
inline constexpr char kAffineShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
layout(push_constant) uniform Params { float scale; float offset; } params;
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * params.scale + params.offset;
}
)";

// Busy work: every invocation runs a short dependent loop; nothing is written (the condition is
// never true, but the compiler cannot know). The work scales with the number of invocations,
// not the loop: lavapipe ends a shader's loops after ~65535 iterations.
inline constexpr char kBusyShader[] = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
layout(push_constant) uniform Params { uint iterations; } params;
void main() {
  float acc = float(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y);
  for (uint k = 0; k < params.iterations; ++k) acc = acc * 0.999 + 1.0;
  if (acc == -12345.0) result[0] = acc;
}
)";

}  // namespace komputed::core
