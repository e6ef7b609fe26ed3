#pragma once

#include <grpcpp/support/status.h>
#include <spdlog/common.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "komputed/v1/grpc_status.h"

namespace komputed::server {

// The translation between absl::Status and gRPC's status lives with the wire.
using v1::wire::FromGrpcStatus;
using v1::wire::ToGrpcStatus;

// The same status with `prefix` in front of its message (OK stays OK).
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

// The level at which a failed call is logged: the client's mistakes (INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, ...) and refusals while draining at debug; limits and
// availability (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED) at warn; the
// daemon's own faults (INTERNAL, UNKNOWN, DATA_LOSS) at error. OK is not logged (off).
spdlog::level::level_enum LogLevelFor(const absl::Status& status);

// How logs name a session: the first 8 hex digits of its id. The whole id is what lets a caller use
// a session (with its tenant's credentials), so logs, which more people read, do not carry it.
std::string SessionLogName(absl::string_view id);

// Logs a failed call (nothing for OK) at LogLevelFor's level, as
// "METHOD failed in session ID8: CODE: message" (SessionLogName), or "METHOD failed (PEER): ..."
// when the call names no session.
void LogFailure(absl::string_view method, absl::string_view session_id, absl::string_view peer,
                const absl::Status& status);

}  // namespace komputed::server
