#pragma once
// A compute kernel that takes as long as a test needs, on any device: for tests that must catch
// an evaluation while it runs (drain, queue depth). Each v[i] goes through
// x = x * 1664525 + 1013904223 (an LCG step, which no compiler folds into a closed form)
// units * reps * kSlowUnit times, so the host can check the result.
//
// llvmpipe (lavapipe) stops an invocation's loops after 65535 iterations in all, so on a CPU
// device reps stays 1 and units below kMaxSlowUnits; a GPU is fast enough to need reps.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/time/time.h"

namespace komputed::test_support {

inline constexpr uint32_t kSlowUnit = 32;  // LCG steps unrolled into one loop iteration
inline constexpr uint32_t kMaxSlowUnits = 60000;
inline constexpr char kSlowShader[] = R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Buf { uint v[]; };
layout(push_constant) uniform Push { uint units; uint reps; };
#define S x = x * 1664525u + 1013904223u;
#define S8 S S S S S S S S
void main() {
  uint i = gl_GlobalInvocationID.x;
  uint x = v[i];
  for (uint r = 0u; r < reps; ++r) {
    for (uint j = 0u; j < units; ++j) { S8 S8 S8 S8 }
  }
  v[i] = x;
}
)";

// A kernel that never ends on a GPU while its push constant `iterations` is 0: each invocation
// loops for ever (lavapipe ends an invocation's loops after about 65535 iterations, so there the
// work is in the number of invocations: 65535 x 64 workgroups of 64 are hours of it). For the
// kernel watchdog's tests and benchmark. Binding 0: a float buffer that is never written.
inline constexpr char kRunawayShader[] = R"(
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { float result[]; };
layout(push_constant) uniform Params { uint iterations; } params;
void main() {
  float acc = float(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y);
  for (uint k = 0; params.iterations == 0u || k < params.iterations; ++k) acc = acc * 0.999 + 1.0;
  if (acc == -12345.0) result[0] = acc;
}
)";

// How much kSlowShader does per element.
struct SlowWork {
  uint32_t units = 1;
  uint32_t reps = 1;

  uint64_t iterations() const { return uint64_t{units} * reps; }
  // kSlowShader's push constants.
  std::string PushConstants() const {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &units, 4);
    std::memcpy(bytes.data() + 4, &reps, 4);
    return bytes;
  }
  // The most work of at most `iterations` loop iterations that the device runs correctly.
  static SlowWork Of(double iterations, bool cpu_device) {
    iterations = std::max(1.0, iterations);
    SlowWork w;
    if (cpu_device || iterations <= kMaxSlowUnits) {
      w.units = static_cast<uint32_t>(std::min(iterations, double{kMaxSlowUnits}));
      return w;
    }
    w.units = kMaxSlowUnits;
    w.reps = static_cast<uint32_t>(std::min(iterations / kMaxSlowUnits, 1e6));
    return w;
  }
};

// What kSlowShader computes from x.
inline uint32_t Lcg(uint32_t x, const SlowWork& work) {
  const uint64_t steps = work.iterations() * kSlowUnit;
  for (uint64_t k = 0; k < steps; ++k) x = x * 1664525u + 1013904223u;
  return x;
}

// Work that takes about `target` on the device: `seconds_for(work)` runs an evaluation of that
// work and returns how long it took (the fastest of a few tries is best). The work grows until
// an evaluation takes a tenth of the target, so that round trips do not skew the estimate, then
// it is scaled to the target. On a CPU device the target may not be reached (kMaxSlowUnits).
template <typename SecondsFor>
SlowWork SlowWorkFor(absl::Duration target, bool cpu_device, SecondsFor seconds_for) {
  const double want = absl::ToDoubleSeconds(target);
  SlowWork work = SlowWork::Of(128, cpu_device);
  for (int tries = 0; tries < 12; ++tries) {
    const double seconds = std::max(1e-6, seconds_for(work));
    const double scaled = static_cast<double>(work.iterations()) * want / seconds;
    if (seconds >= want / 10) return SlowWork::Of(scaled, cpu_device);
    const SlowWork next =
        SlowWork::Of(std::min(scaled / 5, static_cast<double>(work.iterations()) * 64), cpu_device);
    if (next.iterations() <= work.iterations()) return next;  // as much as this device runs
    work = next;
  }
  return work;
}

}  // namespace komputed::test_support
