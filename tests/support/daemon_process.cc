#include "support/daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "support/process.h"

namespace komputed::test_support {
namespace {

// The daemons alive, and the validation errors of those gone.
struct Registry {
  std::mutex mu;
  std::set<const DaemonProcess*> alive;
  uint64_t gone_errors = 0;
};
Registry& Daemons() {
  static Registry* registry = new Registry();
  return *registry;
}

// How the daemon logs a validation layer's error (core's message, spdlog's level name).
uint64_t CountValidationErrors(const std::string& log) {
  uint64_t n = 0;
  for (size_t at = log.find("[error] vulkan validation"); at != std::string::npos;
       at = log.find("[error] vulkan validation", at + 1)) {
    ++n;
  }
  return n;
}

}  // namespace

uint64_t DaemonProcess::ValidationErrors() {
  Registry& r = Daemons();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t n = r.gone_errors;
  for (const DaemonProcess* d : r.alive) n += CountValidationErrors(d->Log());
  return n;
}

DaemonProcess::DaemonProcess(const std::vector<std::string>& flags) {
  {
    Registry& r = Daemons();
    std::lock_guard<std::mutex> lock(r.mu);
    r.alive.insert(this);
  }
  char log_template[] = "/tmp/komputed-log-XXXXXX";
  const int log_fd = mkostemp(log_template, O_CLOEXEC);
  if (log_fd < 0) {
    ADD_FAILURE() << "mkostemp: " << std::strerror(errno);
    return;
  }
  log_path_ = log_template;
  std::vector<std::string> argv = {KomputedBinary(), "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0"};
  // The sanitizer suites raise the kernel watchdog's limit (a test's own flag still wins).
  if (const char* limit = std::getenv("KOMPUTED_TEST_MAX_KERNEL_TIME"); limit != nullptr) {
    argv.push_back(std::string("--max_kernel_time=") + limit);
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  pid_ = Spawn(argv, &stdout_fd_, log_fd);
  const int spawn_errno = errno;
  close(log_fd);
  if (pid_ < 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawn_errno);
    return;
  }
  // stdout carries exactly these two lines, in this order.
  const absl::Time until = absl::Now() + absl::Seconds(60);
  const std::string first = ReadLine(stdout_fd_, until);
  const std::string second = ReadLine(stdout_fd_, until);
  const std::string listening = "komputed listening on ";
  const std::string metrics = "komputed metrics on ";
  if (absl::StartsWith(first, listening)) address_ = first.substr(listening.size());
  if (absl::StartsWith(second, metrics)) metrics_address_ = second.substr(metrics.size());
  if (!started()) {
    ADD_FAILURE() << argv[0] << " did not print its addresses; stdout: '" << first << "', '"
                  << second << "'; stderr:\n"
                  << Log();
  }
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  {
    Registry& r = Daemons();
    std::lock_guard<std::mutex> lock(r.mu);
    r.alive.erase(this);
    r.gone_errors += CountValidationErrors(Log());
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

int DaemonProcess::WaitExit(absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  const int status = test_support::WaitExit(pid_, timeout);
  if (status != -1) pid_ = -1;
  return status;
}

int DaemonProcess::Stop(int signal, absl::Duration timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  return WaitExit(timeout);
}

std::string DaemonProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool DaemonProcess::WaitForLog(const std::string& text, absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    if (absl::StrContains(Log(), text)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::StrContains(Log(), text);
}

std::string ScrapeMetrics(const std::string& metrics_address) {
  const size_t colon = metrics_address.rfind(':');
  if (colon == std::string::npos) return "";
  const std::string host = metrics_address.substr(0, colon);
  const std::string port = metrics_address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return "";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return "";
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request =
      absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", metrics_address, "\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") ||
      !absl::StrContains(response.substr(0, body), " 200 ") || body == std::string::npos) {
    return "";
  }
  return response.substr(body + 4);
}

}  // namespace komputed::test_support
