#include "support/daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "support/process.h"

namespace komputed::test_support {

DaemonProcess::DaemonProcess(const std::vector<std::string>& flags) {
  char log_template[] = "/tmp/komputed-log-XXXXXX";
  const int log_fd = mkostemp(log_template, O_CLOEXEC);
  if (log_fd < 0) {
    ADD_FAILURE() << "mkostemp: " << std::strerror(errno);
    return;
  }
  log_path_ = log_template;
  std::vector<std::string> argv = {KomputedBinary(), "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0"};
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

}  // namespace komputed::test_support
