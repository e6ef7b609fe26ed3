#pragma once
// The one converter between komputed's own operation and type descriptions
// (komputed/core/op_semantics.h, komputed/core/types.h) and the wire's messages. The client
// encodes with it and the daemon decodes with it; the enums' numbering is checked against the
// wire's at compile time (semantics_wire.cc).

#include <cstdint>

#include "absl/status/statusor.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/types.h"
#include "komputed/v1/komputed.pb.h"

namespace komputed::v1::wire {

// An operation as the wire carries it: tensors and the algorithm named by their handles.
using HandleOp = core::HandleOp;

ElementType ToWire(core::ElementType type);
MemoryType ToWire(core::MemoryType type);
// INVALID_ARGUMENT for a value that the enum does not have (a newer or hostile peer).
absl::StatusOr<core::ElementType> FromWire(ElementType type);
absl::StatusOr<core::MemoryType> FromWire(MemoryType type);

Operation ToWire(const HandleOp& op);
// INVALID_ARGUMENT for an empty operation. The operation's rules are not checked here: that is
// done where its tensors are known (core::ValidateOpTensors).
absl::StatusOr<HandleOp> FromWire(const Operation& operation);

}  // namespace komputed::v1::wire
