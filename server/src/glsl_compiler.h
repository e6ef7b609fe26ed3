#pragma once
// GLSL from clients is compiled in a child process (the komputed_glslc program), so that a source
// that makes the compiler run away — a macro that expands to gigabytes, a parse that never ends,
// a crash inside shaderc — costs that one request and never the daemon. The child runs with a
// bound on its address space and CPU time, and is killed at a wall-clock deadline.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace komputed::server {

struct GlslCompileLimits {
  absl::Duration wall_time = absl::Seconds(20);
  uint64_t memory_bytes = uint64_t{2} << 30;    // the child's address space (RLIMIT_AS); 0: none
  uint64_t spirv_bytes = uint64_t{64} << 20;    // the most SPIR-V read back
  uint64_t message_bytes = uint64_t{64} << 10;  // the most of the compiler's messages kept
};

// Compiles `source` with the komputed_glslc program at `compiler`. INVALID_ARGUMENT with the
// compiler's messages for a source that does not compile (as core::CompileGlsl); RESOURCE_EXHAUSTED
// naming the bound for a compile that ran out of time or memory; INTERNAL for a compiler that
// crashed or could not be started. Thread-safe; blocks the calling thread for at most the wall
// time (plus the child's exit).
absl::StatusOr<std::vector<uint32_t>> CompileGlslInChild(const std::string& compiler,
                                                         absl::string_view source,
                                                         absl::string_view name,
                                                         const GlslCompileLimits& limits);

// How the daemon compiles a client's GLSL: with the komputed_glslc program at `compiler` within
// `limits` (CompileGlslInChild), or, when `compiler` is empty, inside the daemon
// (core::CompileGlsl; only for tests and tools that trust their sources). `name` names the shader
// in the compiler's messages. Errors as CompileGlslInChild's. Thread-safe.
absl::StatusOr<std::vector<uint32_t>> CompileClientGlsl(const std::string& compiler,
                                                        const GlslCompileLimits& limits,
                                                        absl::string_view source,
                                                        absl::string_view name);

// Where the komputed_glslc program is by default: beside the running program.
std::string DefaultGlslCompiler();

}  // namespace komputed::server
