#pragma once
// Limits of the Execute stream's batches (ExecuteRequest.more_evals, ExecuteEvent.more_events),
// which the client and the daemon share.

#include <cstddef>
#include <cstdint>

namespace komputed::v1::wire {

// Evals in one ExecuteRequest (eval and more_evals together), at most; events in one
// ExecuteEvent (it and its more_events), at most.
inline constexpr size_t kMaxExecuteBatch = 64;
// Bytes of the events that the daemon writes together, at most (a larger event goes alone).
inline constexpr uint64_t kMaxExecuteBatchBytes = uint64_t{1} << 20;

}  // namespace komputed::v1::wire
