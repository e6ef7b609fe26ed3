#pragma once
// Limits of the Execute stream's batches (ExecuteRequest.more_evals, ExecuteEvent.more_events),
// which the client and the daemon share.

#include <cstddef>
#include <cstdint>

namespace komputed::v1::wire {

// Evals in one ExecuteRequest (eval and more_evals together), at most; events in one
// ExecuteEvent (it and its more_events), at most.
inline constexpr size_t kMaxExecuteBatch = 64;
// Bytes of the evals or events sent together, at most (a larger one goes alone).
inline constexpr uint64_t kMaxExecuteBatchBytes = uint64_t{1} << 20;
// What each one packed into a batch adds beyond its own bytes: its field's tag and length.
inline constexpr uint64_t kExecuteBatchEntryBytes = 16;

// The bytes a batch may take when a peer accepts messages of up to `max_message_bytes`: within
// kMaxExecuteBatchBytes and half that limit, so that a batch stays well inside it.
inline uint64_t ExecuteBatchBytes(uint64_t max_message_bytes) {
  return max_message_bytes / 2 < kMaxExecuteBatchBytes ? max_message_bytes / 2
                                                       : kMaxExecuteBatchBytes;
}

}  // namespace komputed::v1::wire
