#pragma once
// The same-host side channel over which a client passes shared memory (sealed memfds) to the
// daemon: a SOCK_SEQPACKET Unix socket in the abstract namespace, named by
// OpenSessionResponse.shared_memory_socket. Each connection carries one request, a fixed-size
// record with exactly one descriptor (SCM_RIGHTS), and one reply; then it is closed. The
// session's ticket (OpenSessionResponse.shared_memory_ticket) says whose memory it is.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace komputed::v1::wire {

// Tickets are this many characters (hex).
inline constexpr size_t kSharedMemoryTicketSize = 32;

// What a client asks: to take `fd`, `size` bytes of shared memory, as region `region` of the
// session whose ticket is `ticket`.
struct SharedMemoryAttach {
  std::string ticket;
  uint64_t region = 0;
  uint64_t size = 0;
  int fd = -1;  // owned by the receiver once received
};

// Client: connects to the abstract socket `socket_name`, passes `fd` (kept by the caller) and
// waits for the daemon's answer, all within `timeout`. The daemon's refusal comes back as its
// status; UNAVAILABLE when the socket cannot be reached or answers nothing in time.
absl::Status PassSharedMemory(const std::string& socket_name, absl::string_view ticket,
                              uint64_t region, int fd, uint64_t size, absl::Duration timeout);

// Daemon: a listening SOCK_SEQPACKET socket at the abstract name `socket_name` (non-blocking,
// close-on-exec), or the error.
absl::StatusOr<int> ListenSharedMemory(const std::string& socket_name);
// Daemon: reads the request waiting on `connection` (non-blocking). INVALID_ARGUMENT for a
// record of another size or version, or one without exactly one descriptor (every descriptor
// that came is closed); UNAVAILABLE when nothing came (the peer closed), UNAVAILABLE with
// "again" when nothing is there yet.
absl::StatusOr<SharedMemoryAttach> ReceiveSharedMemory(int connection);
// Daemon: answers the request of `region` with `status` (its message cut to fit the record).
void AnswerSharedMemory(int connection, uint64_t region, const absl::Status& status);

}  // namespace komputed::v1::wire
