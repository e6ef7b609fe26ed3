#pragma once
// Bounding how much of a device one dispatch holds at a time.
//
// A GPU runs the workgroups of a dispatch as long as it has room for them, and a workgroup keeps
// its room until it ends: a dispatch of more workgroups than the device holds at once fills every
// compute unit, and one whose workgroups never end (a runaway) keeps every other session's work
// out until the kernel watchdog stops it, whatever queue that work is on. LoopOverWorkgroups
// rewrites a shader so that a dispatch of `resident` workgroups does the work of the whole
// dispatch: each real workgroup runs the original entry point once for every virtual workgroup
// it takes (real id, real id + resident, ...), so that at most `resident` workgroups of the
// dispatch ever hold room on the device and the rest stays free for other queues' work.

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace komputed::core {

struct WorkgroupLoop {
  std::array<uint32_t, 3> workgroups = {1, 1, 1};  // the dispatch the program asked for
  uint32_t resident = 1;                           // the workgroups dispatched instead (along x)
};

// Rewrites a compute module whose entry point "main" is to be dispatched as
// (loop.resident, 1, 1) in place of loop.workgroups. Inside the original entry point (now a
// function that a new "main" calls once per virtual workgroup) gl_WorkGroupID,
// gl_GlobalInvocationID and gl_NumWorkGroups read the virtual dispatch's values; the local ids
// are unchanged. A workgroup barrier separates one virtual workgroup from the next in a module
// with shared memory, so that no invocation writes a shared variable that another still reads.
//
// Takes a module that passed ValidateSpirv; the result is what the caller should validate again.
// INVALID_ARGUMENT for a malformed module or options (a zero count, `resident` not below the
// dispatch's workgroups); UNIMPLEMENTED for a module of a form the rewrite does not handle (more
// than one entry point, a built-in it replaces decorating a struct member, decorated twice or
// through a decoration group, or passed to a function, a Private or Workgroup variable with an
// initializer, which would be initialized once for all the virtual workgroups of a real one) or a
// dispatch whose 32-bit loop counters could wrap (2^31 or more workgroups in x): such a dispatch
// can only run as it is.
struct LoopedModule {
  std::vector<uint32_t> spirv;
  uint32_t main = 0;  // the new entry point's function, which loops
  uint32_t body = 0;  // the original entry point's, called once per virtual workgroup
};
absl::StatusOr<LoopedModule> LoopOverWorkgroups(absl::Span<const uint32_t> spirv,
                                                const WorkgroupLoop& loop);

}  // namespace komputed::core
