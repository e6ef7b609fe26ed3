#pragma once
// Bounds shared by every call of the remote backend to a komputed daemon.

#include <grpcpp/client_context.h>

#include <cstdint>

#include "absl/time/time.h"

namespace kp::internal::remote {

// Host data larger than this moves in streamed chunks (BulkTransfer) instead of inside an Eval
// message.
inline constexpr uint64_t kInlineLimit = 4u << 20;

// The bound on object calls (create, destroy, record): $KOMPUTED_RPC_TIMEOUT_S, default 60 s.
absl::Duration RpcTimeout();

// Sets the call's deadline `timeout` from now.
void SetDeadline(grpc::ClientContext& context, absl::Duration timeout);

}  // namespace kp::internal::remote
