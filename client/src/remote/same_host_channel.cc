#include "remote/same_host_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "komputed/core/shared_memory.h"
#include "komputed/core/spin.h"
#include "komputed/v1/shared_memory_wire.h"
#include "spdlog/spdlog.h"

namespace kp::internal::remote {

namespace v1 = komputed::v1;

namespace {

// Receives a record waiting on `fd` into `buffer`, polling without sleep for up to `spin`: its
// size, or -1 (errno EAGAIN) when none came in that time.
ssize_t ReceiveSpinning(int fd, std::vector<char>& buffer, absl::Duration spin) {
  if (spin <= absl::ZeroDuration()) {
    errno = EAGAIN;
    return -1;
  }
  const absl::Time until = absl::Now() + spin;
  for (;;) {
    const ssize_t n = recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return n;
    if (absl::Now() >= until) {
      errno = EAGAIN;
      return -1;
    }
    komputed::core::CpuRelax();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<SameHostChannel>> SameHostChannel::Open(
    const std::string& socket_name, absl::string_view ticket, absl::Duration timeout, bool ring) {
  absl::StatusOr<int> fd = v1::wire::ConnectSharedMemory(socket_name);
  if (!fd.ok()) return absl::UnavailableError(fd.status().message());
  auto channel = std::unique_ptr<SameHostChannel>(new SameHostChannel(*fd));
  bool sent = false;
  komputed::core::SpinWindow sleep_at_once(absl::ZeroDuration(), absl::ZeroDuration());
  absl::StatusOr<std::string> answer =
      channel->RoundTrip(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kBind, ticket),
                         timeout, sleep_at_once, &sent);
  if (!answer.ok()) return answer.status();
  absl::StatusOr<std::string> bound = v1::wire::DecodeChannelReply(*answer);
  if (!bound.ok()) return bound.status();
  if (ring) {
    if (absl::Status attached = channel->AttachRing(timeout); !attached.ok()) {
      // The daemon closes a channel whose ring it refuses: a new one, without.
      spdlog::info("komputed: the same-host channel goes on without a ring ({})",
                   attached.ToString());
      return Open(socket_name, ticket, timeout, /*ring=*/false);
    }
  }
  return channel;
}

bool SameHostChannel::RingWanted() {
  const char* env = std::getenv("KOMPUTED_SAME_HOST_RING");
  return env == nullptr || std::string(env) != "0";
}

absl::Status SameHostChannel::AttachRing(absl::Duration timeout) {
  absl::StatusOr<std::shared_ptr<komputed::core::SharedMemory>> memory =
      komputed::core::SharedMemory::Create(v1::wire::kRingBytes, "komputed-channel-ring");
  if (!memory.ok()) return memory.status();
  const std::string record = v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kRing, {});
  if (!v1::wire::SendRecord(fd_, record.data(), record.size(), (*memory)->fd())) {
    return absl::UnavailableError(
        absl::StrCat("passing the ring on the same-host channel: ", std::strerror(errno)));
  }
  (*memory)->CloseDescriptor();  // the daemon has its own now
  komputed::core::SpinWindow sleep_at_once(absl::ZeroDuration(), absl::ZeroDuration());
  absl::StatusOr<std::string> answer = ReceiveAnswer(timeout, sleep_at_once);
  if (!answer.ok()) return answer.status();
  absl::StatusOr<std::string> taken = v1::wire::DecodeChannelReply(*answer);
  if (!taken.ok()) return taken.status();
  void* base = (*memory)->data();
  ring_ = std::make_unique<v1::wire::ChannelRing>(base, *std::move(memory));
  return absl::OkStatus();
}

SameHostChannel::~SameHostChannel() { Break(); }

void SameHostChannel::Break() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool SameHostChannel::Takes(const v1::EvalRequest& request) {
  return v1::wire::ChannelTakes(request).ok() &&
         request.ByteSizeLong() + 64 <= v1::wire::kMaxChannelRecord;
}

using Sleep = v1::wire::ChannelRing::Sleep;

absl::StatusOr<std::string> SameHostChannel::RingRoundTrip(const std::string& record,
                                                           absl::Duration timeout,
                                                           komputed::core::SpinWindow& spin,
                                                           bool* sent) {
  *sent = false;
  if (fd_ < 0) return absl::UnavailableError("the same-host channel is closed");
  if (record.size() > v1::wire::kMaxChannelRecord) {
    return absl::UnavailableError("a request larger than the same-host channel's ring");
  }
  const uint32_t seq = ++ring_seq_;
  ring_->PutRequest(seq, record);
  // The daemon's end closed: it took the request first or never will (ChannelRing::taken_seq).
  auto closed = [&](absl::Status status) {
    *sent = ring_->taken_seq() == seq;
    Break();
    return status;
  };
  if (ring_->daemon_sleeping()) {
    if (absl::Status rung =
            Send(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kDoorbell, {}));
        !rung.ok()) {
      return closed(rung);
    }
  }
  *sent = true;  // the daemon may take it from here on
  const absl::Time now = absl::Now();
  const absl::Time deadline = now + timeout;
  const absl::Time spin_until = now + std::min(timeout, spin.Window(now, now));
  while (ring_->answer_seq() != seq && absl::Now() < spin_until) komputed::core::CpuRelax();
  thread_local std::vector<char> buffer(v1::wire::kMaxChannelRecord + 1);
  bool hung_up = false;  // the daemon closed its end (after answering, where the answer is there)
  // Asleep on the answer's number where the daemon wakes it so, else on the socket.
  bool on_word = ring_->wakes_answer_word();
  while (ring_->answer_seq() != seq && !hung_up) {
    // Asleep from here: the daemon wakes it after its answer. Looked at again after saying so, in
    // case the answer came in between.
    ring_->set_client_sleeping(on_word ? Sleep::kOnAnswerWord : Sleep::kOnSocket);
    const uint32_t seen = ring_->answer_seq();
    if (seen == seq) {
      ring_->set_client_sleeping(Sleep::kAwake);
      break;
    }
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    if (on_word) {
      const bool slept = ring_->WaitAnswer(seen, std::min(left, v1::wire::kAnswerWordCheck));
      ring_->set_client_sleeping(Sleep::kAwake);
      if (ring_->answer_seq() == seq) break;
      if (!slept) {
        on_word = false;  // sleeps on the socket from here, after saying so
        continue;
      }
    }
    // On the socket: until a doorbell or the deadline. After a sleep on the answer's number: a
    // look, whether the daemon is gone.
    const timespec wait = absl::ToTimespec(on_word ? absl::ZeroDuration() : left);
    pollfd p{fd_, POLLIN, 0};
    const int ready = ppoll(&p, 1, &wait, nullptr);
    const int error = errno;
    ring_->set_client_sleeping(Sleep::kAwake);
    if (ready < 0 && error == EINTR) continue;
    if (ready < 0) {
      Break();  // the daemon may still take the request: sent stays true
      return absl::UnavailableError(
          absl::StrCat("waiting on the same-host channel: ", std::strerror(error)));
    }
    if (ready > 0) {
      // Doorbells only: read them all; a closed socket ends the channel.
      for (;;) {
        const ssize_t n = recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        hung_up = true;
        break;
      }
    } else if (ring_->answer_seq() != seq && absl::Now() >= deadline) {
      Break();  // the daemon may still take the request: sent stays true
      return absl::DeadlineExceededError(absl::StrCat("no answer on the same-host channel within ",
                                                      absl::FormatDuration(timeout)));
    }
  }
  if (ring_->answer_seq() != seq) {
    return closed(absl::UnavailableError("the daemon closed the same-host channel"));
  }
  spin.Observe(absl::Now() - now, /*seen_running=*/true);
  absl::StatusOr<std::string> answer = ring_->TakeAnswer();
  if (!answer.ok() || hung_up) Break();  // opened again for the next eval
  return answer;
}

absl::StatusOr<std::string> SameHostChannel::RoundTrip(const std::string& record,
                                                       absl::Duration timeout,
                                                       komputed::core::SpinWindow& spin,
                                                       bool* sent) {
  if (ring_ != nullptr) return RingRoundTrip(record, timeout, spin, sent);
  *sent = false;
  if (absl::Status status = Send(record); !status.ok()) {
    Break();
    return status;
  }
  *sent = true;
  return ReceiveAnswer(timeout, spin);
}

absl::StatusOr<std::string> SameHostChannel::ReceiveAnswer(absl::Duration timeout,
                                                           komputed::core::SpinWindow& spin) {
  const absl::Time now = absl::Now();
  const absl::Time deadline = now + timeout;
  thread_local std::vector<char> buffer(v1::wire::kMaxChannelRecord + 1);
  if (const ssize_t n = ReceiveSpinning(fd_, buffer, std::min(timeout, spin.Window(now, now)));
      n > 0 && static_cast<size_t>(n) <= v1::wire::kMaxChannelRecord) {
    spin.Observe(absl::Now() - now, /*seen_running=*/true);
    return std::string(buffer.data(), static_cast<size_t>(n));
  }
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      Break();
      return absl::DeadlineExceededError(absl::StrCat("no answer on the same-host channel within ",
                                                      absl::FormatDuration(timeout)));
    }
    const ssize_t n = recv(fd_, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || static_cast<size_t>(n) > v1::wire::kMaxChannelRecord) {
      Break();
      return absl::UnavailableError("the daemon closed the same-host channel");
    }
    spin.Observe(absl::Now() - now, /*seen_running=*/true);  // late by the wake-up
    return std::string(buffer.data(), static_cast<size_t>(n));
  }
}

absl::StatusOr<v1::EvalResponse> SameHostChannel::Eval(const v1::EvalRequest& request,
                                                       absl::Duration timeout,
                                                       komputed::core::SpinWindow& spin,
                                                       bool* sent) {
  absl::StatusOr<std::string> answer = RoundTrip(
      v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kEval, request.SerializeAsString()),
      timeout, spin, sent);
  if (!answer.ok()) return answer.status();
  absl::StatusOr<std::string> payload = v1::wire::DecodeChannelReply(*answer);
  if (!payload.ok()) return payload.status();
  v1::EvalResponse response;
  if (!response.ParseFromString(*payload)) {
    return absl::DataLossError("an answer on the same-host channel that is not an EvalResponse");
  }
  return response;
}

absl::Status SameHostChannel::Send(const std::string& record) {
  if (fd_ < 0) return absl::UnavailableError("the same-host channel is closed");
  if (send(fd_, record.data(), record.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(record.size())) {
    return absl::UnavailableError(
        absl::StrCat("sending on the same-host channel: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status SameHostChannel::Submit(uint64_t id, const v1::EvalRequest& request) {
  return Send(v1::wire::EncodeChannelSubmit(id, request.SerializeAsString()));
}

absl::StatusOr<v1::EvalResponse> SameHostChannel::NextSubmitAnswer(uint64_t* id,
                                                                   absl::Duration spin) {
  *id = 0;
  thread_local std::vector<char> buffer(v1::wire::kMaxChannelRecord + 1);
  ssize_t n = fd_ < 0 ? 0 : ReceiveSpinning(fd_, buffer, spin);
  while (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    n = recv(fd_, buffer.data(), buffer.size(), 0);
  }
  if (n <= 0 || static_cast<size_t>(n) > v1::wire::kMaxChannelRecord) {
    return absl::UnavailableError("the same-host channel closed");
  }
  absl::StatusOr<std::string> payload = v1::wire::DecodeChannelSubmitReply(
      absl::string_view(buffer.data(), static_cast<size_t>(n)), id);
  if (!payload.ok()) return payload.status();
  v1::EvalResponse response;
  if (!response.ParseFromString(*payload)) {
    return absl::DataLossError(
        absl::StrCat("the answer to submit ", *id, " is not an EvalResponse"));
  }
  return response;
}

void SameHostChannel::Shutdown() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

}  // namespace kp::internal::remote
