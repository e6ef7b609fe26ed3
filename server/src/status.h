#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace komputed::server {

// The one translation of an absl::Status into a gRPC status: the codes are the same google.rpc
// codes, mapped one to one; the message is kept as is.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The reverse (for tests and for clients of the daemon).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace komputed::server
