#pragma once
// What a session is asked to do, in komputed's own terms: handles, core types and bytes, free of
// the wire (session_wire.h converts from it). Views (string_view) refer to the caller's memory
// and are read only during the call that takes them.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/types.h"

namespace komputed::server {

// An operation named by the session's handles (komputed/core/op_semantics.h): the same type as
// the wire converter's v1::wire::HandleOp, which FromWire produces.
using HandleOp = core::HandleOp;

// A tensor to create: `count` elements of `type` (of `element_size` bytes; 0: the type's size,
// required above 0 for kBytes), initialised from `data` (count * element size bytes) or, when
// `data` is empty, zero-filled.
struct TensorRequest {
  uint64_t handle = 0;
  core::ElementType type = core::ElementType::kFloat32;
  core::MemoryType memory = core::MemoryType::kDevice;
  uint64_t count = 0;
  uint32_t element_size = 0;
  absl::string_view data;
  core::ImageShape image;  // set: an image (count is then its element count)
  // Not 0: the host data is this shared-memory region (Session::AttachSharedMemory), which the
  // tensor takes; `data` is then empty.
  uint64_t shared_memory = 0;
};

// An algorithm to create or rebuild: its tensors by handle and its shader, SPIR-V (bytes, a whole
// number of 32-bit words) or GLSL source.
struct AlgorithmRequest {
  enum class Shader : uint8_t { kNone, kSpirv, kGlsl };
  uint64_t handle = 0;
  std::vector<uint64_t> tensors;
  Shader shader_kind = Shader::kNone;
  absl::string_view shader;  // the SPIR-V bytes or the GLSL text
  core::Workgroup workgroup;
  std::vector<uint8_t> spec_constants;
  uint32_t spec_constant_size = 4;
  std::vector<uint8_t> push_constants;
};

struct PushConstantsRequest {
  uint64_t algorithm = 0;
  std::vector<uint8_t> values;
};

struct SequenceRequest {
  uint64_t handle = 0;
  uint32_t queue = 0;  // the session's queue index
  uint32_t total_timestamps = 0;
};

// One step of a Record call: record an operation, drop what was recorded, record it all again,
// or nothing (a wire action that asks for no clear or rerecord).
struct SequenceAction {
  enum class Kind : uint8_t { kRecord, kClear, kRerecord, kNothing };
  Kind kind = Kind::kNothing;
  HandleOp op;  // kRecord only
};

struct RecordRequest {
  uint64_t sequence = 0;
  std::vector<SequenceAction> actions;
};

// Destroying an object by its handle.
struct DestroyTensor {
  uint64_t handle = 0;
};
struct DestroyAlgorithm {
  uint64_t handle = 0;
};
struct DestroySequence {
  uint64_t handle = 0;
};
// Rebuilding an existing algorithm (same handle) from a new description.
struct RebuildAlgorithm {
  AlgorithmRequest algorithm;
};

// One of the calls above, as an eval's command.
using SessionCommand = std::variant<TensorRequest, DestroyTensor, AlgorithmRequest,
                                    RebuildAlgorithm, PushConstantsRequest, DestroyAlgorithm,
                                    SequenceRequest, RecordRequest, DestroySequence>;

// What ListSessions reports about a session.
struct SessionSummary {
  std::string id;
  std::string tenant;
  std::string client_name;
  std::string peer;
  uint32_t device_index = 0;
  uint64_t memory_bytes = 0;
  absl::Duration age;
  absl::Duration idle;
  uint32_t tensors = 0;
  uint32_t algorithms = 0;
  uint32_t sequences = 0;
};

}  // namespace komputed::server
