#include "shared_memory_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "komputed/core/shared_memory.h"
#include "komputed/core/spin.h"
#include "komputed/core/thread_name.h"
#include "spdlog/spdlog.h"

namespace komputed::server {

namespace {

// Connections open at once (bound channels and others), those not bound to a session, and how
// long one of those may take to send its request or bind.
constexpr size_t kMaxConnections = 8192;
constexpr size_t kMaxUnbound = 256;
constexpr absl::Duration kRequestTime = absl::Seconds(2);
// Closes of passed descriptors that may wait (v1::wire::ClosePassed, a thread each) before the
// socket takes no more descriptors from the user who passed them, and from anyone: records still
// come, and any descriptor with them is dropped by the kernel unseen. This bounds the threads (and
// files) that clients whose files do not let go can make the daemon hold, and keeps one user's
// from stopping the others' shared memory.
constexpr size_t kMaxPassedClosesPerUser = 16;
constexpr size_t kMaxPassedClosesPending = 64;

// A kEval's answer record: the serialized EvalResponse, or the error.
std::string AnswerRecord(const absl::StatusOr<std::string>& response) {
  return v1::wire::EncodeChannelReply(
      response.status(), response.ok() ? absl::string_view(*response) : absl::string_view());
}

}  // namespace

std::string RandomHex(size_t count) {
  std::vector<unsigned char> bytes(count);
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < bytes.size()) {
    absl::BitGen gen;
    for (unsigned char& b : bytes) b = absl::Uniform<unsigned char>(gen);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string NewSharedMemoryTicket() { return RandomHex(v1::wire::kSharedMemoryTicketSize / 2); }

// One connection. The listener's thread owns it; an answer sent from another thread takes the
// lock, and finds the descriptor closed (and sends nothing) once the listener has closed it.
struct SharedMemoryListener::Connection {
  Connection(int fd, uid_t user, absl::Time deadline) : fd(fd), user(user), deadline(deadline) {}
  // Closes the descriptor (once), and wakes a client asleep on the ring's answer number: it finds
  // no answer, and the socket closed.
  void Close() {
    {
      absl::MutexLock lock(&mu);
      if (fd >= 0) close(fd);
      fd = -1;
    }
    if (ring != nullptr) ring->WakeAnswerWaiters();
  }
  // Ends the connection's use: the listener sees the hang-up and closes it.
  void Hangup() {
    absl::MutexLock lock(&mu);
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  // Sends `record` unless closed; a client that does not take it is cut off.
  void Send(const std::string& record) {
    absl::MutexLock lock(&mu);
    if (fd < 0) return;
    if (send(fd, record.data(), record.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
        static_cast<ssize_t>(record.size())) {
      shutdown(fd, SHUT_RDWR);  // the listener sees the hang-up and closes it
    }
  }

  // Only the listener's thread changes fd (Close): it reads it without the lock.
  int fd_for_listener() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return fd; }

  // Publishes `record` as the answer to ring request `seq`, and wakes the client if it may be
  // asleep: on the answer's number, or on the socket (a doorbell record).
  void RingAnswer(uint32_t seq, const std::string& record) {
    ring->PutAnswer(seq, record);
    switch (ring->client_sleeping()) {
      case v1::wire::ChannelRing::Sleep::kAwake:
        break;
      case v1::wire::ChannelRing::Sleep::kOnAnswerWord:
        ring->WakeAnswerWaiters();
        if (ring_wake) ring_wake(RingWake::kAnswerWord);
        break;
      case v1::wire::ChannelRing::Sleep::kOnSocket:
        Send(v1::wire::EncodeChannelRequest(v1::wire::ChannelOp::kDoorbell, {}));
        if (ring_wake) ring_wake(RingWake::kSocket);
        break;
    }
  }
  // Whether a request waits in the ring (reactor thread only). A number once seen to differ from
  // the last one taken is taken next, whatever the client writes meanwhile: a request noticed is
  // always served or refused, so that a client cannot keep the thread looking without being served.
  bool RingHasWork() {
    if (ring == nullptr) return false;
    if (!ring_noticed) {
      const uint32_t seq = ring->request_seq();
      if (seq != ring_seen) {
        ring_noticed = true;
        ring_next = seq;
      }
    }
    return ring_noticed;
  }

  absl::Mutex mu;
  int fd ABSL_GUARDED_BY(mu);
  const uid_t user;  // the peer's (SO_PEERCRED)
  // Listener thread only:
  absl::Time deadline;  // unbound connections: closed past it
  std::string ticket;   // set once bound
  // Set while an eval of the channel runs (cleared by its answer, from any thread).
  std::atomic<bool> in_flight{false};
  // Submits not answered yet (at most kMaxChannelSubmits).
  std::atomic<size_t> submits{0};
  // The channel's ring, once passed (set on its reactor before any eval that answers into it),
  // mapped as long as an answer may still be written there.
  std::unique_ptr<v1::wire::ChannelRing> ring;
  std::function<void(RingWake)> ring_wake;  // set with `ring` (Handlers::ring_wake)
  // Reactor thread only: the last request taken from it, and the next one once noticed.
  uint32_t ring_seen = 0;
  uint32_t ring_next = 0;
  bool ring_noticed = false;
};

// A reactor: its thread, the bound connections given to it, and the eventfd that wakes it for new
// ones or for the stop.
struct SharedMemoryListener::Reactor {
  int wake_fd = -1;
  absl::Mutex mu;
  std::vector<std::shared_ptr<Connection>> incoming ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread thread;

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }
};

absl::StatusOr<std::unique_ptr<SharedMemoryListener>> SharedMemoryListener::Start(
    Handlers handlers, size_t reactors, absl::Duration spin) {
  auto listener = std::unique_ptr<SharedMemoryListener>(new SharedMemoryListener());
  listener->spin_ = spin;
  listener->name_ = absl::StrCat("komputed-", getpid(), "-", RandomHex(8));
  listener->handlers_ = std::move(handlers);
  absl::StatusOr<int> fd = v1::wire::ListenSharedMemory(listener->name_);
  if (!fd.ok()) return fd.status();
  listener->listen_fd_ = *fd;
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listener->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  for (size_t i = 0; i < std::max<size_t>(reactors, 1); ++i) {
    auto reactor = std::make_unique<Reactor>();
    reactor->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (reactor->wake_fd < 0) {
      return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
    }
    listener->reactors_.push_back(std::move(reactor));
  }
  for (auto& reactor : listener->reactors_) {
    reactor->thread = std::thread([l = listener.get(), r = reactor.get()] {
      core::NameThisThread("kd-shm-reactor");
      l->React(*r);
    });
  }
  listener->worker_ = std::thread([l = listener.get()] {
    core::NameThisThread("kd-shm-import");
    l->Work();
  });
  listener->thread_ = std::thread([l = listener.get()] {
    core::NameThisThread("kd-shm-accept");
    l->Run();
  });
  return listener;
}

void SharedMemoryListener::Work() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&jobs_mu_);
      jobs_mu_.Await(absl::Condition(
          +[](SharedMemoryListener* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->jobs_mu_) {
            return l->stopping_ || !l->jobs_.empty();
          },
          this));
      if (jobs_.empty()) return;  // stopping
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

SharedMemoryListener::~SharedMemoryListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (auto& reactor : reactors_) {
    if (!reactor->thread.joinable()) continue;
    {
      absl::MutexLock lock(&reactor->mu);
      reactor->stopping = true;
    }
    reactor->Wake();
    reactor->thread.join();
  }
  for (auto& reactor : reactors_) {
    if (reactor->wake_fd >= 0) close(reactor->wake_fd);
  }
  {
    absl::MutexLock lock(&jobs_mu_);
    stopping_ = true;
    jobs_.clear();  // their connections are closed: no answer could be sent
  }
  if (worker_.joinable()) worker_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

SharedMemoryListener::Next SharedMemoryListener::Handle(const std::shared_ptr<Connection>& c,
                                                        v1::wire::ReceivedRecord received) {
  if (!v1::wire::IsChannelRecord(received.record)) {
    if (!c->ticket.empty()) return Next::kClose;  // a bound channel carries channel records only
    if (received.descriptor_dropped) {
      c->Send(v1::wire::RefuseSharedMemory(received.record, v1::wire::DescriptorsNotTaken()));
      return Next::kClose;
    }
    absl::StatusOr<v1::wire::SharedMemoryAttach> request =
        v1::wire::ParseSharedMemory(std::move(received));
    if (!request.ok()) {
      c->Send(v1::wire::EncodeSharedMemoryAnswer(0, request.status()));
      return Next::kClose;
    }
    if (c->in_flight.exchange(true)) return Next::kClose;  // a second one while the first is taken
    // Taken on a worker (importing a large region into the device may take a while); the
    // connection ends with its answer (one region per connection). A job dropped as the listener
    // stops closes the request's descriptor with it.
    auto job = [this, c,
                request = std::make_shared<v1::wire::SharedMemoryAttach>(*std::move(request))] {
      const uint64_t region = request->region;
      const std::string answer =
          v1::wire::EncodeSharedMemoryAnswer(region, handlers_.take(std::move(*request)));
      c->Send(answer);
      c->Hangup();
    };
    absl::MutexLock lock(&jobs_mu_);
    jobs_.push_back(std::move(job));
    return Next::kKeep;
  }
  if (received.descriptor_dropped) {
    c->Send(v1::wire::EncodeChannelReply(v1::wire::DescriptorsNotTaken(), {}));
    return Next::kClose;
  }
  v1::wire::ChannelOp op;
  absl::string_view payload;
  absl::Status status = v1::wire::DecodeChannelRequest(received.record, &op, &payload);
  if (status.ok() && op == v1::wire::ChannelOp::kRing) {
    return AttachRing(c, std::move(received.fd));
  }
  // A descriptor here is refused; it is closed with `received` as this returns.
  if (status.ok() && received.fd) {
    status = absl::InvalidArgumentError("a channel record with descriptors");
  }
  if (!status.ok()) {
    c->Send(v1::wire::EncodeChannelReply(status, {}));
    return Next::kClose;
  }
  if (op == v1::wire::ChannelOp::kBind) {
    if (!c->ticket.empty()) {
      c->Send(v1::wire::EncodeChannelReply(
          absl::FailedPreconditionError("the channel is bound already"), {}));
      return Next::kClose;
    }
    status = handlers_.bind(payload);
    c->Send(v1::wire::EncodeChannelReply(status, {}));
    if (!status.ok()) return Next::kClose;
    c->ticket = std::string(payload);
    return Next::kBound;
  }
  if (op == v1::wire::ChannelOp::kSubmit) return Submit(c, payload);
  if (op == v1::wire::ChannelOp::kDoorbell) return Next::kKeep;  // the reactor looks at its rings
  // kEval: on a bound channel, one at a time.
  if (c->ticket.empty() || c->in_flight.exchange(true)) {
    c->Send(v1::wire::EncodeChannelReply(
        absl::FailedPreconditionError(c->ticket.empty()
                                          ? "an eval on a channel bound to no session"
                                          : "an eval while the channel's last one still runs"),
        {}));
    return Next::kClose;
  }
  handlers_.eval(c->ticket, std::string(payload), /*may_wait_inline=*/true,
                 [c](absl::StatusOr<std::string> response) {
                   c->in_flight.store(false);
                   c->Send(AnswerRecord(response));
                 });
  return Next::kKeep;
}

SharedMemoryListener::Next SharedMemoryListener::AttachRing(const std::shared_ptr<Connection>& c,
                                                            v1::wire::PassedFd fd) {
  absl::Status status;
  if (!fd) {
    status = absl::InvalidArgumentError("a ring record without its descriptor");
  } else if (c->ticket.empty()) {
    status = absl::FailedPreconditionError("a ring on a channel bound to no session");
  } else if (c->ring != nullptr) {
    status = absl::FailedPreconditionError("the channel has a ring already");
  } else if (c->in_flight.load()) {
    status = absl::FailedPreconditionError("a ring while the channel's eval still runs");
  }
  if (!status.ok()) {
    c->Send(v1::wire::EncodeChannelReply(status, {}));
    return Next::kClose;
  }
  const uint64_t page = core::SharedMemory::PageSize();
  const uint64_t size = (v1::wire::kRingBytes + page - 1) / page * page;
  absl::StatusOr<std::shared_ptr<core::SharedMemory>> memory =
      core::SharedMemory::Adopt(fd.get(), size, size);
  if (!memory.ok()) {
    c->Send(v1::wire::EncodeChannelReply(memory.status(), {}));
    return Next::kClose;
  }
  void* base = (*memory)->data();
  c->ring = std::make_unique<v1::wire::ChannelRing>(base, *std::move(memory));
  c->ring_wake = handlers_.ring_wake;
  c->ring_seen = c->ring->request_seq();
  c->ring->set_wakes_answer_word();
  if (handlers_.ring_taken) handlers_.ring_taken();
  c->Send(v1::wire::EncodeChannelReply(absl::OkStatus(), {}));
  return Next::kKeep;
}

SharedMemoryListener::Next SharedMemoryListener::ServeRing(const std::shared_ptr<Connection>& c,
                                                           bool* served) {
  if (!c->RingHasWork()) return Next::kKeep;
  *served = true;
  const uint32_t seq = c->ring_next;
  c->ring_seen = seq;
  c->ring_noticed = false;
  absl::StatusOr<std::string> record = c->ring->TakeRequest();  // a copy: the client may write on
  c->ring->set_taken_seq(seq);
  v1::wire::ChannelOp op = v1::wire::ChannelOp::kEval;
  absl::string_view payload;
  absl::Status status = record.status();
  if (status.ok()) status = v1::wire::DecodeChannelRequest(*record, &op, &payload);
  if (status.ok() && op != v1::wire::ChannelOp::kEval) {
    status = absl::InvalidArgumentError("a ring request that is not an eval");
  }
  if (status.ok() && c->in_flight.exchange(true)) {
    status = absl::FailedPreconditionError("an eval while the channel's last one still runs");
  }
  if (!status.ok()) {
    c->RingAnswer(seq, v1::wire::EncodeChannelReply(status, {}));
    return Next::kClose;
  }
  if (handlers_.ring_eval) handlers_.ring_eval();
  handlers_.eval(c->ticket, std::string(payload), /*may_wait_inline=*/true,
                 [c, seq](absl::StatusOr<std::string> response) {
                   c->in_flight.store(false);  // before the answer: the client's next may follow
                   c->RingAnswer(seq, AnswerRecord(response));
                 });
  return Next::kKeep;
}

SharedMemoryListener::Next SharedMemoryListener::Submit(const std::shared_ptr<Connection>& c,
                                                        absl::string_view payload) {
  uint64_t id = 0;
  absl::string_view request;
  absl::Status status = v1::wire::DecodeChannelSubmit(payload, &id, &request);
  if (status.ok() && c->ticket.empty()) {
    status = absl::FailedPreconditionError("a submit on a channel bound to no session");
  }
  if (!status.ok()) {
    c->Send(v1::wire::EncodeChannelSubmitReply(id, status, {}));
    return Next::kClose;
  }
  if (c->submits.fetch_add(1) >= v1::wire::kMaxChannelSubmits) {
    c->submits.fetch_sub(1);
    c->Send(v1::wire::EncodeChannelSubmitReply(
        id,
        absl::ResourceExhaustedError(absl::StrCat("more than ", v1::wire::kMaxChannelSubmits,
                                                  " submits at once on the same-host channel; "
                                                  "await some first")),
        {}));
    return Next::kKeep;
  }
  handlers_.eval(c->ticket, std::string(request), /*may_wait_inline=*/false,
                 [c, id](absl::StatusOr<std::string> response) {
                   // Sent before the place is given back: at most kMaxChannelSubmits answers wait
                   // in the socket for a client that reads slowly.
                   c->Send(v1::wire::EncodeChannelSubmitReply(
                       id, response.status(), response.ok() ? *response : std::string()));
                   c->submits.fetch_sub(1);
                 });
  return Next::kKeep;
}

bool SharedMemoryListener::TakesDescriptors(uid_t user) {
  const v1::wire::PassedCloses pending = v1::wire::PassedClosesPending(user);
  const bool all = pending.all < kMaxPassedClosesPending;
  const bool users = pending.of_owner < kMaxPassedClosesPerUser;
  absl::MutexLock lock(&refusing_mu_);
  if (refusing_all_ == all) {
    refusing_all_ = !all;
    if (all) {
      spdlog::info("shared-memory socket @{}: passed descriptors closed; taking them again", name_);
    } else {
      spdlog::warn(
          "shared-memory socket @{}: {} descriptors that clients passed wait for their close "
          "(files whose file system does not answer, such as a client's FUSE mount); no "
          "descriptor is taken until fewer do (clients keep their tensors on gRPC)",
          name_, kMaxPassedClosesPending);
    }
  }
  if (!users && refusing_users_.insert(user).second) {
    spdlog::warn(
        "shared-memory socket @{}: {} descriptors that user {} passed wait for their close "
        "(files whose file system does not answer, such as a FUSE mount of theirs); none of that "
        "user's is taken until fewer do (their clients keep their tensors on gRPC)",
        name_, kMaxPassedClosesPerUser, user);
  } else if (users && refusing_users_.erase(user) > 0) {
    spdlog::info("shared-memory socket @{}: descriptors of user {} closed; taking theirs again",
                 name_, user);
  }
  return all && users;
}

SharedMemoryListener::Next SharedMemoryListener::Serve(const std::shared_ptr<Connection>& c) {
  absl::StatusOr<v1::wire::ReceivedRecord> received =
      v1::wire::ReceiveRecord(c->fd_for_listener(), TakesDescriptors(c->user), c->user);
  if (received.ok()) return Handle(c, *std::move(received));
  if (received.status().message() == "again") return Next::kKeep;  // nothing there yet
  if (absl::IsInvalidArgument(received.status())) {
    c->Send(v1::wire::EncodeChannelReply(received.status(), {}));
  }
  return Next::kClose;
}

void SharedMemoryListener::React(Reactor& reactor) {
  std::vector<std::shared_ptr<Connection>> connections;
  std::vector<pollfd> polled;
  absl::Time spin_until = absl::InfinitePast();  // polling without sleep until then
  auto rings_have_work = [&connections] {
    for (const auto& c : connections) {
      if (c->RingHasWork()) return true;
    }
    return false;
  };
  // Tells the clients of the rings whether a request needs a doorbell; false if there is none.
  auto set_sleeping = [&connections](bool sleeping) {
    bool any = false;
    for (const auto& c : connections) {
      if (c->ring == nullptr) continue;
      c->ring->set_daemon_sleeping(sleeping);
      any = true;
    }
    return any;
  };
  for (;;) {
    // The rings first: a request there came without a record on the socket.
    bool served = false;
    {
      std::vector<std::shared_ptr<Connection>> kept;
      for (const auto& c : connections) {
        if (ServeRing(c, &served) == Next::kKeep) {
          kept.push_back(c);
        } else {
          c->Close();
        }
      }
      connections.swap(kept);
    }
    if (served && spin_ > absl::ZeroDuration()) spin_until = absl::Now() + spin_;
    polled.clear();
    polled.push_back({reactor.wake_fd, POLLIN, 0});
    for (const auto& c : connections) polled.push_back({c->fd_for_listener(), POLLIN, 0});
    int ready;
    while (true) {
      bool sleep = absl::Now() >= spin_until || (handlers_.may_poll && !handlers_.may_poll());
      // A client that publishes a request after this looks at the flag and rings; one that
      // published before is seen by the second look.
      if (sleep && set_sleeping(true) && rings_have_work()) {
        set_sleeping(false);
        sleep = false;
      }
      ready = poll(polled.data(), polled.size(), sleep ? -1 : 0);
      if (sleep) set_sleeping(false);
      if (ready != 0 || rings_have_work()) break;
      core::CpuRelax();
    }
    if (ready < 0 && errno != EINTR) {
      spdlog::error("shared-memory socket @{}: poll: {}", name_, std::strerror(errno));
      break;
    }
    if (polled[0].revents != 0) {
      uint64_t count;
      (void)!read(reactor.wake_fd, &count, sizeof(count));
      absl::MutexLock lock(&reactor.mu);
      if (reactor.stopping) break;
      for (auto& c : reactor.incoming) connections.push_back(std::move(c));
      reactor.incoming.clear();
    }
    std::vector<std::shared_ptr<Connection>> kept;
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      const std::shared_ptr<Connection>& c = connections[i];
      const bool keep = polled[i + 1].revents == 0 || Serve(c) == Next::kKeep;
      if (keep) {
        kept.push_back(c);
      } else {
        c->Close();
      }
    }
    // Connections that came with the wake-up were not polled yet: kept as they are.
    for (size_t i = polled.size() - 1; i < connections.size(); ++i) kept.push_back(connections[i]);
    connections.swap(kept);
    if (ready > 0 && spin_ > absl::ZeroDuration()) spin_until = absl::Now() + spin_;
  }
  for (const auto& c : connections) c->Close();
  absl::MutexLock lock(&reactor.mu);
  for (const auto& c : reactor.incoming) c->Close();
  reactor.incoming.clear();
}

void SharedMemoryListener::Run() {
  std::vector<std::shared_ptr<Connection>> connections;
  std::vector<pollfd> polled;
  for (;;) {
    polled.clear();
    polled.push_back({wake_fd_, POLLIN, 0});
    polled.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (const auto& c : connections) {
      polled.push_back({c->fd_for_listener(), POLLIN, 0});
      if (c->ticket.empty()) next = std::min(next, c->deadline);
    }
    const absl::Duration wait = next - absl::Now();
    const int timeout =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(absl::ToInt64Milliseconds(wait) + 1, 0));
    if (poll(polled.data(), polled.size(), timeout) < 0 && errno != EINTR) {
      spdlog::error("shared-memory socket @{}: poll: {}", name_, std::strerror(errno));
      break;
    }
    if (polled[0].revents != 0) break;
    // Records first, then deadlines, then new connections.
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Connection>> kept;
    size_t unbound = 0;
    for (size_t i = 0; i < connections.size(); ++i) {
      const std::shared_ptr<Connection>& c = connections[i];
      bool keep = true;
      if (polled[i + 2].revents != 0) {
        const Next next = Serve(c);
        keep = next == Next::kKeep;
        if (next == Next::kBound) {
          // Its evals go to a reactor from here on.
          Reactor& r = *reactors_[next_reactor_++ % reactors_.size()];
          {
            absl::MutexLock lock(&r.mu);
            r.incoming.push_back(c);
          }
          r.Wake();
          continue;
        }
      }
      // An unbound connection past its time is closed, unless its region is being taken.
      if (keep && c->ticket.empty() && !c->in_flight.load() && now >= c->deadline) keep = false;
      if (keep) {
        if (c->ticket.empty()) ++unbound;
        kept.push_back(c);
      } else {
        c->Close();
      }
    }
    connections.swap(kept);
    if (polled[1].revents != 0) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (unbound >= kMaxUnbound || connections.size() >= kMaxConnections) {
          close(fd);
          continue;
        }
        absl::StatusOr<uid_t> user = v1::wire::PeerUser(fd);
        if (!user.ok()) {
          close(fd);
          continue;
        }
        ++unbound;
        connections.push_back(std::make_shared<Connection>(fd, *user, now + kRequestTime));
      }
    }
  }
  for (const auto& c : connections) c->Close();
}

}  // namespace komputed::server
