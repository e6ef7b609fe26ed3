#include "shared_memory_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace komputed::server {

namespace {

// Connections open at once, and how long each may take to send its request.
constexpr size_t kMaxConnections = 256;
constexpr absl::Duration kRequestTime = absl::Seconds(2);

std::string RandomHex(size_t bytes_wanted) {
  std::vector<unsigned char> bytes(bytes_wanted);
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

}  // namespace

std::string NewSharedMemoryTicket() { return RandomHex(v1::wire::kSharedMemoryTicketSize / 2); }

absl::StatusOr<std::unique_ptr<SharedMemoryListener>> SharedMemoryListener::Start(Take take) {
  auto listener = std::unique_ptr<SharedMemoryListener>(new SharedMemoryListener());
  listener->name_ = absl::StrCat("komputed-", getpid(), "-", RandomHex(8));
  listener->take_ = std::move(take);
  absl::StatusOr<int> fd = v1::wire::ListenSharedMemory(listener->name_);
  if (!fd.ok()) return fd.status();
  listener->listen_fd_ = *fd;
  listener->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listener->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  listener->thread_ = std::thread([l = listener.get()] { l->Run(); });
  return listener;
}

SharedMemoryListener::~SharedMemoryListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void SharedMemoryListener::Run() {
  struct Connection {
    int fd;
    absl::Time deadline;
  };
  std::vector<Connection> connections;
  std::vector<pollfd> polled;
  for (;;) {
    polled.clear();
    polled.push_back({wake_fd_, POLLIN, 0});
    polled.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (const Connection& c : connections) {
      polled.push_back({c.fd, POLLIN, 0});
      next = std::min(next, c.deadline);
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
    // Requests first, then deadlines, then new connections.
    const absl::Time now = absl::Now();
    std::vector<Connection> kept;
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short events = polled[i + 2].revents;
      bool done = false;
      if (events != 0) {
        absl::StatusOr<v1::wire::SharedMemoryAttach> request = v1::wire::ReceiveSharedMemory(c.fd);
        if (request.ok()) {
          const uint64_t region = request->region;
          v1::wire::AnswerSharedMemory(c.fd, region, take_(*std::move(request)));
          done = true;
        } else if (request.status().message() != "again") {
          if (absl::IsInvalidArgument(request.status())) {
            v1::wire::AnswerSharedMemory(c.fd, 0, request.status());
          }
          done = true;
        }
      }
      if (!done && now >= c.deadline) done = true;
      if (done) {
        close(c.fd);
      } else {
        kept.push_back(c);
      }
    }
    connections.swap(kept);
    if (polled[1].revents != 0) {
      for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (connections.size() >= kMaxConnections) {
          close(fd);
          continue;
        }
        connections.push_back({fd, now + kRequestTime});
      }
    }
  }
  for (const Connection& c : connections) close(c.fd);
}

}  // namespace komputed::server
