#pragma once
// The real komputed binary run as a child process, for tests that talk to it over the network.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace komputed::test_support {

// One komputed process, owned by the object that started it. It serves on 127.0.0.1:0 with its
// metrics on 127.0.0.1:0; both addresses are read from its stdout, and its stderr (its log) goes
// to a file that the destructor removes. The constructor waits (bounded) for the two address
// lines and otherwise records a test failure and leaves started() false.
//
// address(), metrics_address(), Log() and WaitForLog() may be called from any thread; pid(),
// Stop() and WaitExit() from one thread at a time.
class DaemonProcess {
 public:
  // Starts KomputedBinary() --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 `flags...`.
  explicit DaemonProcess(const std::vector<std::string>& flags = {});
  // SIGKILL if it still runs.
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  bool started() const { return !address_.empty() && !metrics_address_.empty(); }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // The process id while it runs; -1 once an exit has been collected.
  pid_t pid() const { return pid_; }
  // Sends `signal`, waits for the exit up to `timeout`: the wait status, or -1.
  int Stop(int signal, absl::Duration timeout);
  // Waits for an exit already under way: the wait status, or -1 after `timeout`.
  int WaitExit(absl::Duration timeout);
  // What it wrote to stderr (its log) so far.
  std::string Log() const;
  // Waits until the log contains `text`; false after `timeout`.
  bool WaitForLog(const std::string& text, absl::Duration timeout) const;

  // The errors that VK_LAYER_KHRONOS_validation reported (as the daemon logs them) in every
  // daemon this process started, running or gone. Thread-safe.
  static uint64_t ValidationErrors();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;  // the read end of its stdout, open while the object lives
  std::string address_;
  std::string metrics_address_;
  std::string log_path_;
};

// GET http://METRICS_ADDRESS/metrics: the body, or "" when the daemon does not answer.
std::string ScrapeMetrics(const std::string& metrics_address);

}  // namespace komputed::test_support
