#pragma once
// The one translation between absl::Status and gRPC's status, for the daemon and its clients: the
// codes are the same google.rpc codes, mapped one to one; the message is kept as it is.

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace komputed::v1::wire {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// The same, the message prefixed with what failed ("writing tensor 3: ...").
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what);

}  // namespace komputed::v1::wire
