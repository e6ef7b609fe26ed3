#pragma once
// A client's connection to a daemon's shared-memory socket (komputed/v1/shared_memory_wire.h), for
// channel records sent and read by hand. Header-only, for targets that link komputed::proto.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "komputed/v1/shared_memory_wire.h"

namespace komputed::test_support {

// A connection to the daemon's shared-memory socket, for channel records by hand.
class RawChannel {
 public:
  explicit RawChannel(const std::string& name) {
    absl::StatusOr<int> fd = v1::wire::ConnectSharedMemory(name);
    connected_ = fd.ok();
    fd_ = fd.ok() ? *fd : -1;
  }
  ~RawChannel() { close(fd_); }
  bool connected() const { return connected_; }

  // Sends `record` (with `fd` when not -1) and returns the decoded answer; UNAVAILABLE when the
  // daemon closed the connection without one.
  absl::StatusOr<std::string> Ask(const std::string& record, int fd = -1) {
    if (!v1::wire::SendRecord(fd_, record.data(), record.size(), fd)) {
      return absl::UnavailableError("send failed");
    }
    return Answer();
  }
  absl::StatusOr<std::string> Answer() {
    absl::StatusOr<std::string> record = Record();
    if (!record.ok()) return record.status();
    return v1::wire::DecodeChannelReply(*record);
  }
  // The next record as it came, or DEADLINE_EXCEEDED once `wait` has passed without one.
  absl::StatusOr<std::string> Record(absl::Duration wait = absl::Seconds(10)) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) <= 0) {
      return absl::DeadlineExceededError("no answer");
    }
    std::string buf(v1::wire::kMaxChannelRecord + 1, '\0');
    const ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
    if (n <= 0) return absl::UnavailableError("closed");
    buf.resize(static_cast<size_t>(n));
    return buf;
  }
  bool Send(const std::string& record) {
    return send(fd_, record.data(), record.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(record.size());
  }
  // The next submit answer: its status (or response bytes), and its id in `id`.
  absl::StatusOr<std::string> SubmitAnswer(uint64_t* id) {
    *id = 0;
    absl::StatusOr<std::string> record = Record();
    if (!record.ok()) return record.status();
    return v1::wire::DecodeChannelSubmitReply(*record, id);
  }
  // Whether the daemon has closed the connection (within 10 s).
  bool Closed() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) return false;
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_DONTWAIT);
    // ECONNRESET: the daemon closed it with a record of ours still unread (a doorbell after the
    // request that ended the channel).
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

}  // namespace komputed::test_support
