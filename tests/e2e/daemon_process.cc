#include "daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace komputed::testing {

std::string DaemonProcess::DefaultBinary() {
  const char* env = std::getenv("KOMPUTED_BINARY");
  return env != nullptr && env[0] != '\0' ? env : KOMPUTED_BINARY;
}

DaemonProcess::DaemonProcess(const std::vector<std::string>& flags, const std::string& binary) {
  int out[2];
  if (pipe(out) != 0) std::abort();
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0",
                                     "--metrics_listen=127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    std::perror("execv komputed");
    _exit(127);
  }
  close(out[1]);
  // Read stdout until the address line, for at most 60 s.
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const std::string marker = "komputed listening on ";
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[512];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    auto at = text.find(marker);
    if (at != std::string::npos) {
      auto end = text.find('\n', at);
      if (end != std::string::npos) {
        address_ = text.substr(at + marker.size(), end - at - marker.size());
        break;
      }
    }
  }
  if (address_.empty()) {
    std::fprintf(stderr, "komputed did not print its address; output: %s\n", text.c_str());
    kill(pid_, SIGKILL);
    std::abort();
  }
  // Keep draining stdout in the background so the daemon never blocks on a full pipe.
  std::thread([fd = out[0]] {
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  }).detach();
}

int DaemonProcess::Stop(int signal, int timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && Stop(SIGTERM, 30) == -1) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

}  // namespace komputed::testing
