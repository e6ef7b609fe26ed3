#pragma once
// The same-host side channel over which a client passes shared memory (sealed memfds) to the
// daemon: a SOCK_SEQPACKET Unix socket in the abstract namespace, named by
// OpenSessionResponse.shared_memory_socket. Each connection carries one request, a fixed-size
// record with exactly one descriptor (SCM_RIGHTS), and one reply; then it is closed. The
// session's ticket (OpenSessionResponse.shared_memory_ticket) says whose memory it is.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "komputed/v1/komputed.pb.h"

namespace komputed::v1::wire {

// Tickets are this many characters (hex).
inline constexpr size_t kSharedMemoryTicketSize = 32;

// Daemon: closes a descriptor that a peer passed. A memfd (any shmem file: F_GET_SEALS answers
// for it) is closed at once. Any other may be a file of the peer's own FUSE mount, whose close
// waits, uninterruptibly, until the peer answers (FUSE_FLUSH): it is closed on a thread of its
// own, so that no serving thread waits on a peer and the descriptor leaves the process's table at
// once (a child forked meanwhile would otherwise inherit it, and wait in its exec or exit).
// `owner`: the user (uid) of the peer that passed it, by whom such closes are counted.
void ClosePassed(int fd, uid_t owner);
// How many such closes have not returned yet, of every owner and of `owner` (counting any whose
// thread could not be started yet: it is started by a later ClosePassed or PassedClosesPending).
struct PassedCloses {
  size_t all = 0;
  size_t of_owner = 0;
};
PassedCloses PassedClosesPending(uid_t owner);
// The user (uid) of the peer of the Unix socket `connection` (SO_PEERCRED), or the error.
absl::StatusOr<uid_t> PeerUser(int connection);

// Daemon: a descriptor that a peer passed, closed with ClosePassed when it goes. Every path that
// receives one holds it in this, so that none can leak it or close it on a serving thread.
class PassedFd {
 public:
  PassedFd() = default;
  PassedFd(int fd, uid_t owner) : fd_(fd), owner_(owner) {}
  PassedFd(PassedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)), owner_(other.owner_) {}
  PassedFd& operator=(PassedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
      owner_ = other.owner_;
    }
    return *this;
  }
  PassedFd(const PassedFd&) = delete;
  PassedFd& operator=(const PassedFd&) = delete;
  ~PassedFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() { ClosePassed(std::exchange(fd_, -1), owner_); }

 private:
  int fd_ = -1;
  uid_t owner_ = 0;
};

// What a client asks: to take `fd`, `size` bytes of shared memory, as region `region` of the
// session whose ticket is `ticket`.
struct SharedMemoryAttach {
  std::string ticket;
  uint64_t region = 0;
  uint64_t size = 0;
  PassedFd fd;
};

// A SOCK_SEQPACKET connection (close-on-exec) to the abstract socket `socket_name`: its
// descriptor, the caller's to close. UNAVAILABLE when it cannot be reached (INVALID_ARGUMENT for a
// name that no abstract address holds).
absl::StatusOr<int> ConnectSharedMemory(const std::string& socket_name);

// Client: connects to the abstract socket `socket_name`, passes `fd` (kept by the caller) and
// waits for the daemon's answer, all within `timeout`. The daemon's refusal comes back as its
// status; UNAVAILABLE when the socket cannot be reached or answers nothing in time.
absl::Status PassSharedMemory(const std::string& socket_name, absl::string_view ticket,
                              uint64_t region, int fd, uint64_t size, absl::Duration timeout);

// Sends `size` bytes at `data` as one record on `connection`, with the descriptor `fd` when it is
// not -1 (SCM_RIGHTS); false unless the whole record went.
bool SendRecord(int connection, const void* data, size_t size, int fd);

// Daemon: a listening SOCK_SEQPACKET socket at the abstract name `socket_name` (non-blocking,
// close-on-exec), or the error.
absl::StatusOr<int> ListenSharedMemory(const std::string& socket_name);
// Daemon: a record received, with the descriptor that came with it, if one did.
struct ReceivedRecord {
  std::string record;
  PassedFd fd;
  // A descriptor came with the record and was dropped unseen (not taken): the record is to be
  // refused with RESOURCE_EXHAUSTED and DescriptorsNotTaken's message.
  bool descriptor_dropped = false;
};
// Daemon: reads the record waiting on `connection` (non-blocking), with the one descriptor that
// may come with it (passed by user `owner`) unless `take_descriptors` is false (then the kernel
// drops any, unseen, and says so in descriptor_dropped). UNAVAILABLE when the peer closed the
// connection, UNAVAILABLE with "again" when nothing is there yet; INVALID_ARGUMENT for a record
// over kMaxChannelRecord bytes or with more than one descriptor.
absl::StatusOr<ReceivedRecord> ReceiveRecord(int connection, bool take_descriptors, uid_t owner);
// The refusal of a record whose descriptor was not taken.
absl::Status DescriptorsNotTaken();
// Daemon: the shared-memory request in `received`. INVALID_ARGUMENT for a record of another size
// or version, or one without a descriptor.
absl::StatusOr<SharedMemoryAttach> ParseSharedMemory(ReceivedRecord received);
// Daemon: the answer record to the request of `region`: `status`, its message cut to fit.
std::string EncodeSharedMemoryAnswer(uint64_t region, const absl::Status& status);
// Daemon: the refusal `status` of the shared-memory request `record`, as the answer to its region
// (to region 0 where the record is not one).
std::string RefuseSharedMemory(absl::string_view record, const absl::Status& status);

// The same-host eval channel: a connection to the same socket that first binds itself to a
// session (its ticket), then carries EvalRequests and their answers, as records of at most
// kMaxChannelRecord bytes: either one kEval at a time (answered before the next), or kSubmits,
// up to kMaxChannelSubmits at once, each tagged with the client's id and answered, with that id,
// as its submission completes (asynchronous evals). Evals that create objects or bring data back
// in the answer, or that do not fit, go over gRPC instead.
inline constexpr size_t kMaxChannelRecord = 64 << 10;
inline constexpr size_t kMaxChannelSubmits = 64;

// kRing: a bound channel's record that carries a ring (ChannelRing) as its one descriptor; its
// evals go through the ring from then on. kDoorbell: on a channel with a ring, "look at the ring"
// (either way; no payload, no answer).
enum class ChannelOp : uint32_t { kBind = 1, kEval = 2, kSubmit = 3, kRing = 4, kDoorbell = 5 };

// Whether the channel takes `request` (INVALID_ARGUMENT naming why not): it creates no object and
// has no downloads. Its size is checked where it is encoded (kMaxChannelRecord).
absl::Status ChannelTakes(const EvalRequest& request);

// A channel record: `op`, then `payload` (kBind: the ticket; kEval: a serialized EvalRequest).
std::string EncodeChannelRequest(ChannelOp op, absl::string_view payload);
// INVALID_ARGUMENT unless `record` is a channel request of this version.
absl::Status DecodeChannelRequest(absl::string_view record, ChannelOp* op,
                                  absl::string_view* payload);
// Whether `record` is a channel request rather than a shared-memory request.
bool IsChannelRecord(absl::string_view record);
// An answer: `status`, and with OK, `payload` (a serialized EvalResponse; empty for kBind).
std::string EncodeChannelReply(const absl::Status& status, absl::string_view payload);
// The answer's status, or the payload of an OK answer; DATA_LOSS for a malformed record.
absl::StatusOr<std::string> DecodeChannelReply(absl::string_view record);

// kSubmit: the request record (the payload is `id`, then the serialized EvalRequest), its
// payload's parts (INVALID_ARGUMENT for one too short to hold an id), and the answer: `status`
// and with OK `response` (a serialized EvalResponse), tagged with `id` either way.
std::string EncodeChannelSubmit(uint64_t id, absl::string_view request);
absl::Status DecodeChannelSubmit(absl::string_view payload, uint64_t* id,
                                 absl::string_view* request);
std::string EncodeChannelSubmitReply(uint64_t id, const absl::Status& status,
                                     absl::string_view response);
// The answer's id, and its status or the response of an OK answer; DATA_LOSS (and no id) for a
// malformed record.
absl::StatusOr<std::string> DecodeChannelSubmitReply(absl::string_view record, uint64_t* id);

// A channel's ring: shared memory (a sealed memfd of kRingBytes, passed with kRing) through which
// the channel's kEval records and their answers go instead of the socket, one at a time, so that a
// client and a daemon that both poll exchange an eval without a system call. The client writes a
// request record (EncodeChannelRequest(kEval, ...)) and publishes it under the next request
// number; the daemon writes the answer record (EncodeChannelReply) and publishes it under the
// request's number. Each side says when it may sleep instead of looking at the ring; the other then
// sends it a kDoorbell record on the socket, which also tells a sleeper that the peer is gone (the
// socket closes). A client may instead sleep on the answer's number itself (a futex on the shared
// page) where the daemon said, before it answered kRing, that it wakes such a sleeper: a wake-up
// then costs each side one system call, where a doorbell costs a send, a poll and two receives.
// Such a client still looks at the socket now and then (kAnswerWordCheck), to learn that the daemon
// is gone. The daemon copies a request out of the ring before it reads it: the client may write
// the memory at any time.
inline constexpr size_t kRingHeaderBytes = 4096;
// How long a client asleep on the answer's number sleeps at most before it looks at the socket.
inline constexpr absl::Duration kAnswerWordCheck = absl::Milliseconds(20);
inline constexpr size_t kRingBytes = kRingHeaderBytes + 2 * kMaxChannelRecord;

class ChannelRing {
 public:
  // Over `base`, kRingBytes of shared memory, kept mapped by `mapping` (whatever owns it) as long
  // as the ring lives.
  ChannelRing(void* base, std::shared_ptr<const void> mapping)
      : mapping_(std::move(mapping)), base_(static_cast<char*>(base)) {}

  // Client: writes `record` (at most kMaxChannelRecord bytes) and publishes it as request `seq`.
  void PutRequest(uint32_t seq, absl::string_view record);
  // Daemon: the last request's number, and (once it differs from the last one taken) a copy of
  // its record: INVALID_ARGUMENT when its size is over kMaxChannelRecord.
  uint32_t request_seq() const;
  absl::StatusOr<std::string> TakeRequest() const;

  // Daemon: writes `record` (at most kMaxChannelRecord bytes) and publishes it as the answer to
  // request `seq`.
  void PutAnswer(uint32_t seq, absl::string_view record);
  // Daemon: says that request `seq` was taken (read out of the ring), before it runs. Client:
  // the last request taken: one not taken by the time the daemon's end of the socket is closed
  // was never run (only the daemon's channel thread takes requests and closes channels).
  void set_taken_seq(uint32_t seq) { Word(kTakenSeq).store(seq); }
  uint32_t taken_seq() const { return Word(kTakenSeq).load(); }
  // Client: the number of the request last answered, and a copy of the answer (DATA_LOSS when its
  // size is over kMaxChannelRecord).
  uint32_t answer_seq() const;
  absl::StatusOr<std::string> TakeAnswer() const;

  // Whether each side may be asleep: set before a sleep and looked at (sequentially consistent)
  // after publishing, so that of a publish and a sleep that cross, one side sees the other.
  void set_daemon_sleeping(bool sleeping) { Word(kDaemonSleeping).store(sleeping ? 1 : 0); }
  bool daemon_sleeping() const { return Word(kDaemonSleeping).load() != 0; }
  // How the client may be asleep: not at all, on the socket (woken by a kDoorbell record), or on
  // the answer's number (woken by WakeAnswerWaiters). The daemon reads any other value the client
  // wrote as kOnSocket.
  enum class Sleep : uint32_t { kAwake = 0, kOnSocket = 1, kOnAnswerWord = 2 };
  void set_client_sleeping(Sleep how) { Word(kClientSleeping).store(static_cast<uint32_t>(how)); }
  Sleep client_sleeping() const;

  // Daemon: says, before it answers kRing, that it wakes a client asleep on the answer's number.
  // Client: whether the daemon said so (else it sleeps on the socket).
  void set_wakes_answer_word() { Word(kDaemonWakes).store(1); }
  bool wakes_answer_word() const { return Word(kDaemonWakes).load() == 1; }
  // Client: sleeps while the answer's number is `seen`, for `up_to` at most; returns at once when
  // it differs already, and may return early (a wake-up, a signal). False when the system does not
  // let it sleep so (the futex call failed otherwise): sleep on the socket instead. Daemon: wakes
  // the clients asleep so (after PutAnswer, and when it closes the channel).
  bool WaitAnswer(uint32_t seen, absl::Duration up_to) const;
  void WakeAnswerWaiters() const;

  // The header's words (native-endian uint32), each number on a cache line of its own; the
  // request's record at kRingHeaderBytes, the answer's kMaxChannelRecord bytes after it.
  enum Offset : size_t {
    kRequestSeq = 0,
    kRequestSize = 4,
    kAnswerSeq = 64,
    kAnswerSize = 68,
    kDaemonSleeping = 128,
    kClientSleeping = 192,
    kTakenSeq = 256,
    kDaemonWakes = 320,
  };

 private:
  // Writes `record` (cut at kMaxChannelRecord) into `area`, its size into `size_word`, and then
  // publishes `seq` in `seq_word`.
  void Put(Offset seq_word, Offset size_word, char* area, uint32_t seq, absl::string_view record);
  std::atomic_ref<uint32_t> Word(Offset offset) const {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(base_ + offset));
  }
  char* request() const { return base_ + kRingHeaderBytes; }
  char* answer() const { return base_ + kRingHeaderBytes + kMaxChannelRecord; }

  std::shared_ptr<const void> mapping_;
  char* base_;
};

}  // namespace komputed::v1::wire
