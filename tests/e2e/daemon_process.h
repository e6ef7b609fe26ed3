#pragma once
// Starts the real komputed binary for end-to-end tests and stops it.

#include <sys/types.h>

#include <string>
#include <vector>

namespace komputed::testing {

class DaemonProcess {
 public:
  // Starts `binary` with --listen=127.0.0.1:0 plus `flags`, and waits (bounded) for the line
  // "komputed listening on ADDRESS". Aborts the test binary on failure.
  // `binary` defaults to $KOMPUTED_BINARY, else the one this build made.
  explicit DaemonProcess(const std::vector<std::string>& flags = {},
                         const std::string& binary = DefaultBinary());
  static std::string DefaultBinary();
  // SIGTERM, then SIGKILL after 30 s.
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // Sends `signal` and waits (bounded by timeout_s) for the exit; returns the exit status as
  // waitpid reports it, or -1 on timeout.
  int Stop(int signal, int timeout_s);

 private:
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace komputed::testing
