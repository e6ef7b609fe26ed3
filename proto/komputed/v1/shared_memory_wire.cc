#include "komputed/v1/shared_memory_wire.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace komputed::v1::wire {

namespace {

constexpr uint32_t kMagic = 0x4d53444b;  // "KDSM"
constexpr uint32_t kVersion = 1;

struct Request {
  uint32_t magic;
  uint32_t version;
  char ticket[kSharedMemoryTicketSize];
  uint64_t region;
  uint64_t size;
};

struct Reply {
  uint32_t magic;
  int32_t code;  // absl::StatusCode
  uint64_t region;
  char message[240];  // NUL-terminated
};

// The closes of passed descriptors that may wait (ClosePassed): each on a thread of its own, so
// that none waits in the process's descriptor table, where a child that the process forks would
// inherit it and wait on it too when it execs or exits.
class PassedClosers {
 public:
  static PassedClosers& Get() {
    static PassedClosers* const closers = new PassedClosers();  // never destroyed: threads use it
    return *closers;
  }

  void Close(int fd, uid_t owner) {
    absl::MutexLock lock(&mu_);
    waiting_.emplace_back(fd, owner);
    ++by_owner_[owner];
    StartLocked();
  }

  PassedCloses closing(uid_t owner) {
    absl::MutexLock lock(&mu_);
    StartLocked();
    auto it = by_owner_.find(owner);
    return PassedCloses{.all = closing_ + waiting_.size(),
                        .of_owner = it == by_owner_.end() ? 0 : it->second};
  }

 private:
  // Starts a closing thread for each descriptor waiting for one. One that cannot be started yet
  // (the process is out of threads) stays waiting, and counted, for the next call to try again.
  void StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!waiting_.empty()) {
      const int fd = waiting_.back().first;
      const uid_t owner = waiting_.back().second;
      try {
        std::thread([this, fd, owner] {
          pthread_setname_np(pthread_self(), "kd-close");
          close(fd);
          absl::MutexLock lock(&mu_);
          --closing_;
          if (--by_owner_[owner] == 0) by_owner_.erase(owner);
        }).detach();
      } catch (const std::system_error&) {
        return;
      }
      waiting_.pop_back();
      ++closing_;
    }
  }

  absl::Mutex mu_;
  size_t closing_ ABSL_GUARDED_BY(mu_) = 0;  // threads started that have not closed theirs
  // Descriptors without a thread yet, and their owners.
  std::vector<std::pair<int, uid_t>> waiting_ ABSL_GUARDED_BY(mu_);
  // Closes not returned yet (waiting or started) by owner; none at 0.
  absl::flat_hash_map<uid_t, size_t> by_owner_ ABSL_GUARDED_BY(mu_);
};

// The abstract address of `name`: a NUL, then the name (no terminator).
absl::StatusOr<std::pair<sockaddr_un, socklen_t>> Address(const std::string& name) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory socket name of ", name.size(), " bytes"));
  }
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  return std::make_pair(address,
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size()));
}

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

}  // namespace

absl::StatusOr<int> ConnectSharedMemory(const std::string& socket_name) {
  auto address = Address(socket_name);
  if (!address.ok()) return address.status();
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return absl::UnavailableError(Errno("socket"));
  if (connect(s, reinterpret_cast<const sockaddr*>(&address->first), address->second) != 0) {
    absl::Status error =
        absl::UnavailableError(Errno(absl::StrCat("connecting to @", socket_name)));
    close(s);
    return error;
  }
  return s;
}

bool SendRecord(int connection, const void* data, size_t size, int fd) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(connection, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(size);
}

absl::Status PassSharedMemory(const std::string& socket_name, absl::string_view ticket,
                              uint64_t region, int fd, uint64_t size, absl::Duration timeout) {
  if (ticket.size() != kSharedMemoryTicketSize) {
    return absl::InvalidArgumentError("shared-memory ticket of the wrong size");
  }
  absl::StatusOr<int> connected = ConnectSharedMemory(socket_name);
  if (!connected.ok()) return connected.status();
  const int s = *connected;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{s};
  Request request{};
  request.magic = kMagic;
  request.version = kVersion;
  std::memcpy(request.ticket, ticket.data(), kSharedMemoryTicketSize);
  request.region = region;
  request.size = size;
  if (!SendRecord(s, &request, sizeof(request), fd)) {
    return absl::UnavailableError(Errno("passing shared memory"));
  }
  pollfd p{s, POLLIN, 0};
  const int64_t ms = std::max<int64_t>(absl::ToInt64Milliseconds(timeout), 1);
  int ready;
  do {
    ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    return absl::UnavailableError(absl::StrCat("the daemon did not answer on @", socket_name,
                                               " within ", absl::FormatDuration(timeout)));
  }
  Reply reply{};
  const ssize_t n = recv(s, &reply, sizeof(reply), 0);
  if (n != static_cast<ssize_t>(sizeof(reply)) || reply.magic != kMagic || reply.region != region) {
    return absl::UnavailableError(
        absl::StrCat("no valid answer on @", socket_name, " to passing shared memory"));
  }
  reply.message[sizeof(reply.message) - 1] = '\0';
  const auto code = static_cast<absl::StatusCode>(reply.code);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, reply.message);
}

void ClosePassed(int fd, uid_t owner) {
  if (fd < 0) return;
  // A shmem file has no flush to wait on; F_GET_SEALS asks no file system.
  if (fcntl(fd, F_GET_SEALS) >= 0) {
    close(fd);
    return;
  }
  PassedClosers::Get().Close(fd, owner);
}

PassedCloses PassedClosesPending(uid_t owner) { return PassedClosers::Get().closing(owner); }

absl::StatusOr<uid_t> PeerUser(int connection) {
  ucred credentials{};
  socklen_t size = sizeof(credentials);
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
    return absl::UnavailableError(Errno("the peer's credentials (SO_PEERCRED)"));
  }
  return credentials.uid;
}

absl::StatusOr<int> ListenSharedMemory(const std::string& socket_name) {
  auto address = Address(socket_name);
  if (!address.ok()) return address.status();
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return absl::UnavailableError(Errno("socket"));
  if (bind(s, reinterpret_cast<const sockaddr*>(&address->first), address->second) != 0 ||
      listen(s, 128) != 0) {
    absl::Status error = absl::UnavailableError(Errno(absl::StrCat("listening on @", socket_name)));
    close(s);
    return error;
  }
  return s;
}

absl::StatusOr<ReceivedRecord> ReceiveRecord(int connection, bool take_descriptors, uid_t owner) {
  ReceivedRecord received;
  // Received into a buffer kept by the thread (a record may be up to kMaxChannelRecord bytes;
  // most are a few hundred), then copied at its size.
  thread_local std::vector<char> buffer(kMaxChannelRecord + 1);
  iovec iov{buffer.data(), buffer.size()};
  // Room for the one descriptor that a record may carry, or none: the kernel drops what does not
  // fit without ever putting it in this process's table (and says so with MSG_CTRUNC).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = take_descriptors ? control : nullptr;
  msg.msg_controllen = take_descriptors ? sizeof(control) : 0;
  const ssize_t n = recvmsg(connection, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::UnavailableError("again");
  }
  // Each descriptor is owned from here on: any that a refusal below leaves is closed with it.
  std::vector<PassedFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd, owner);
    }
  }
  if (n <= 0) return absl::UnavailableError("the client closed the connection");
  if (static_cast<size_t>(n) > kMaxChannelRecord || (msg.msg_flags & MSG_TRUNC)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record over the daemon's ", kMaxChannelRecord, " bytes"));
  }
  received.descriptor_dropped = (msg.msg_flags & MSG_CTRUNC) && !take_descriptors;
  if (((msg.msg_flags & MSG_CTRUNC) && take_descriptors) || fds.size() > 1) {
    return absl::InvalidArgumentError("a record with more than one descriptor");
  }
  if (!fds.empty()) received.fd = std::move(fds.front());
  received.record.assign(buffer.data(), static_cast<size_t>(n));
  return received;
}

absl::StatusOr<SharedMemoryAttach> ParseSharedMemory(ReceivedRecord received) {
  Request request{};
  if (received.record.size() != sizeof(request)) {
    return absl::InvalidArgumentError(absl::StrCat("a shared-memory request of ",
                                                   received.record.size(),
                                                   " bytes; the daemon takes ", sizeof(request)));
  }
  std::memcpy(&request, received.record.data(), sizeof(request));
  if (request.magic != kMagic || request.version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shared-memory request of version ", request.version, "; the daemon takes ", kVersion));
  }
  if (!received.fd) {
    return absl::InvalidArgumentError("a shared-memory request without its descriptor");
  }
  SharedMemoryAttach attach;
  attach.ticket.assign(request.ticket, kSharedMemoryTicketSize);
  attach.region = request.region;
  attach.size = request.size;
  attach.fd = std::move(received.fd);
  return attach;
}

absl::Status DescriptorsNotTaken() {
  return absl::ResourceExhaustedError(
      "the daemon takes no descriptors from this user for now: too many that were passed wait for "
      "their close (files whose file system does not answer, such as a FUSE mount)");
}

std::string RefuseSharedMemory(absl::string_view record, const absl::Status& status) {
  Request request{};
  if (record.size() == sizeof(request)) std::memcpy(&request, record.data(), sizeof(request));
  return EncodeSharedMemoryAnswer(request.region, status);
}

std::string EncodeSharedMemoryAnswer(uint64_t region, const absl::Status& status) {
  Reply reply{};
  reply.magic = kMagic;
  reply.code = static_cast<int32_t>(status.code());
  reply.region = region;
  const absl::string_view message = status.message();
  if (!message.empty()) {
    std::memcpy(reply.message, message.data(), std::min(message.size(), sizeof(reply.message) - 1));
  }
  return std::string(reinterpret_cast<const char*>(&reply), sizeof(reply));
}

namespace {

constexpr uint32_t kChannelMagic = 0x4553444b;  // "KDSE"

struct ChannelRequestHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t op;
  uint32_t payload_size;
};

struct ChannelReplyHeader {
  uint32_t magic;
  int32_t code;
  uint32_t message_size;
  uint32_t payload_size;
};

}  // namespace

absl::Status ChannelTakes(const EvalRequest& request) {
  for (const Command& command : request.commands()) {
    if (command.has_create_tensor() || command.has_create_algorithm() ||
        command.has_rebuild_algorithm()) {
      return absl::InvalidArgumentError(
          "a channel eval that creates objects (send those over gRPC)");
    }
  }
  if (request.downloads_size() > 0) {
    return absl::InvalidArgumentError(
        "a channel eval with downloads (shared tensors need none; send others over gRPC)");
  }
  return absl::OkStatus();
}

std::string EncodeChannelRequest(ChannelOp op, absl::string_view payload) {
  ChannelRequestHeader h{kChannelMagic, kVersion, static_cast<uint32_t>(op),
                         static_cast<uint32_t>(payload.size())};
  std::string record(reinterpret_cast<const char*>(&h), sizeof(h));
  if (!payload.empty()) record.append(payload.data(), payload.size());
  return record;
}

bool IsChannelRecord(absl::string_view record) {
  uint32_t magic = 0;
  if (record.size() < sizeof(magic)) return false;
  std::memcpy(&magic, record.data(), sizeof(magic));
  return magic == kChannelMagic;
}

absl::Status DecodeChannelRequest(absl::string_view record, ChannelOp* op,
                                  absl::string_view* payload) {
  ChannelRequestHeader h{};
  if (record.size() < sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a channel record of ", record.size(), " bytes, shorter than its header"));
  }
  std::memcpy(&h, record.data(), sizeof(h));
  if (h.magic != kChannelMagic || h.version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("a channel record of version ", h.version, "; the daemon takes ", kVersion));
  }
  if (h.payload_size != record.size() - sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("a channel record whose payload of ",
                                                   record.size() - sizeof(h), " bytes is not the ",
                                                   h.payload_size, " bytes that its header says"));
  }
  if (h.op < static_cast<uint32_t>(ChannelOp::kBind) ||
      h.op > static_cast<uint32_t>(ChannelOp::kDoorbell)) {
    return absl::InvalidArgumentError(absl::StrCat("a channel record of unknown op ", h.op));
  }
  *op = static_cast<ChannelOp>(h.op);
  *payload = record.substr(sizeof(h));
  return absl::OkStatus();
}

namespace {

// A reply record: `status` (its message cut to fit) and `payload`, whatever the status.
std::string EncodeReply(const absl::Status& status, absl::string_view payload) {
  const absl::string_view message = status.message().substr(0, 4096);
  ChannelReplyHeader h{kChannelMagic, static_cast<int32_t>(status.code()),
                       static_cast<uint32_t>(message.size()),
                       static_cast<uint32_t>(payload.size())};
  std::string record(reinterpret_cast<const char*>(&h), sizeof(h));
  if (!message.empty()) record.append(message.data(), message.size());
  if (!payload.empty()) record.append(payload.data(), payload.size());
  return record;
}

}  // namespace

std::string EncodeChannelReply(const absl::Status& status, absl::string_view payload) {
  return EncodeReply(status, status.ok() ? payload : absl::string_view());
}

namespace {

// A reply's status and payload (the payload of any status: the submit replies carry their id in
// it); DATA_LOSS for a malformed record.
absl::Status ParseChannelReply(absl::string_view record, absl::Status* status,
                               absl::string_view* payload) {
  ChannelReplyHeader h{};
  if (record.size() < sizeof(h)) return absl::DataLossError("a short answer on the channel");
  std::memcpy(&h, record.data(), sizeof(h));
  if (h.magic != kChannelMagic ||
      uint64_t{h.message_size} + h.payload_size != record.size() - sizeof(h)) {
    return absl::DataLossError("a malformed answer on the channel");
  }
  *status =
      absl::Status(static_cast<absl::StatusCode>(h.code), record.substr(sizeof(h), h.message_size));
  *payload = record.substr(sizeof(h) + h.message_size);
  return absl::OkStatus();
}

std::string IdBytes(uint64_t id) { return std::string(reinterpret_cast<const char*>(&id), 8); }

}  // namespace

std::string EncodeChannelSubmit(uint64_t id, absl::string_view request) {
  std::string payload = IdBytes(id);
  payload.append(request.data(), request.size());
  return EncodeChannelRequest(ChannelOp::kSubmit, payload);
}

absl::Status DecodeChannelSubmit(absl::string_view payload, uint64_t* id,
                                 absl::string_view* request) {
  if (payload.size() < sizeof(*id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a channel submit of ", payload.size(), " bytes, too short for its id"));
  }
  std::memcpy(id, payload.data(), sizeof(*id));
  *request = payload.substr(sizeof(*id));
  return absl::OkStatus();
}

std::string EncodeChannelSubmitReply(uint64_t id, const absl::Status& status,
                                     absl::string_view response) {
  return EncodeReply(status,
                     absl::StrCat(IdBytes(id), status.ok() ? response : absl::string_view()));
}

absl::StatusOr<std::string> DecodeChannelSubmitReply(absl::string_view record, uint64_t* id) {
  absl::Status status;
  absl::string_view payload;
  if (absl::Status parsed = ParseChannelReply(record, &status, &payload); !parsed.ok()) {
    return parsed;
  }
  if (payload.size() < sizeof(*id)) return absl::DataLossError("a submit answer without its id");
  std::memcpy(id, payload.data(), sizeof(*id));
  if (!status.ok()) return status;
  return std::string(payload.substr(sizeof(*id)));
}

absl::StatusOr<std::string> DecodeChannelReply(absl::string_view record) {
  absl::Status status;
  absl::string_view payload;
  if (absl::Status parsed = ParseChannelReply(record, &status, &payload); !parsed.ok()) {
    return parsed;
  }
  if (!status.ok()) return status;
  return std::string(payload);
}

void ChannelRing::Put(Offset seq_word, Offset size_word, char* area, uint32_t seq,
                      absl::string_view record) {
  const size_t size = std::min(record.size(), kMaxChannelRecord);
  std::memcpy(area, record.data(), size);
  Word(size_word).store(static_cast<uint32_t>(size), std::memory_order_relaxed);
  Word(seq_word).store(seq);  // publishes the bytes and the size with it
}

void ChannelRing::PutRequest(uint32_t seq, absl::string_view record) {
  Put(kRequestSeq, kRequestSize, request(), seq, record);
}

uint32_t ChannelRing::request_seq() const { return Word(kRequestSeq).load(); }

absl::StatusOr<std::string> ChannelRing::TakeRequest() const {
  const uint32_t size = Word(kRequestSize).load(std::memory_order_relaxed);  // read once
  if (size > kMaxChannelRecord) {
    return absl::InvalidArgumentError(absl::StrCat("a ring request of ", size, " bytes, over the ",
                                                   kMaxChannelRecord, " a record may have"));
  }
  return std::string(request(), size);
}

void ChannelRing::PutAnswer(uint32_t seq, absl::string_view record) {
  Put(kAnswerSeq, kAnswerSize, answer(), seq, record);
}

uint32_t ChannelRing::answer_seq() const { return Word(kAnswerSeq).load(); }

ChannelRing::Sleep ChannelRing::client_sleeping() const {
  switch (Word(kClientSleeping).load()) {
    case static_cast<uint32_t>(Sleep::kAwake):
      return Sleep::kAwake;
    case static_cast<uint32_t>(Sleep::kOnAnswerWord):
      return Sleep::kOnAnswerWord;
    default:
      return Sleep::kOnSocket;
  }
}

// The answer's number is a futex word on a page that two processes map: not FUTEX_PRIVATE.
bool ChannelRing::WaitAnswer(uint32_t seen, absl::Duration up_to) const {
  const timespec wait = absl::ToTimespec(std::max(up_to, absl::ZeroDuration()));
  if (syscall(SYS_futex, reinterpret_cast<uint32_t*>(base_ + kAnswerSeq), FUTEX_WAIT, seen, &wait,
              nullptr, 0) == 0) {
    return true;
  }
  // Changed already, past `up_to`, or a signal: all as expected.
  return errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR;
}

void ChannelRing::WakeAnswerWaiters() const {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(base_ + kAnswerSeq), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

absl::StatusOr<std::string> ChannelRing::TakeAnswer() const {
  const uint32_t size = Word(kAnswerSize).load(std::memory_order_relaxed);
  if (size > kMaxChannelRecord) return absl::DataLossError("a ring answer over a record's size");
  return std::string(answer(), size);
}

}  // namespace komputed::v1::wire
