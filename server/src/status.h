#pragma once

#include <grpcpp/support/status.h>
#include <spdlog/common.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace komputed::server {

// The one translation of an absl::Status into a gRPC status: the codes are the same google.rpc
// codes, mapped one to one; the message is kept as is.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The reverse (for tests and for clients of the daemon).
absl::Status FromGrpcStatus(const grpc::Status& status);

// The level at which a failed call is logged: the client's mistakes (INVALID_ARGUMENT,
// NOT_FOUND, FAILED_PRECONDITION, ...) and refusals while draining at debug; limits and
// availability (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED) at warn; the
// daemon's own faults (INTERNAL, UNKNOWN, DATA_LOSS) at error. OK is not logged (off).
spdlog::level::level_enum LogLevelFor(const absl::Status& status);

// Logs a failed call (nothing for OK) at LogLevelFor's level, as
// "METHOD failed in session ID: CODE: message", or "METHOD failed (PEER): ..." when the call
// names no session.
void LogFailure(absl::string_view method, absl::string_view session_id, absl::string_view peer,
                const absl::Status& status);

}  // namespace komputed::server
