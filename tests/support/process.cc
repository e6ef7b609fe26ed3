#include "support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/clock.h"

namespace komputed::test_support {
namespace {

std::string FromEnv(const char* name, const char* otherwise) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : otherwise;
}

// Runs the forks of Spawn on one thread that lasts as long as the process, so that a child's
// PR_SET_PDEATHSIG (which fires when the thread that forked it ends, not the process) stops the
// child only when the process ends, however it ends (SIGKILL included), whichever thread asked.
class Forker {
 public:
  static Forker& Get() {
    static Forker* const forker = new Forker;  // never destroyed: its thread outlives main
    return *forker;
  }
  // Runs `fork_and_exec` on the forking thread; returns once it has run.
  void Run(const std::function<void()>& fork_and_exec) {
    Job job{&fork_and_exec};
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(&job);
    cv_.notify_all();
    cv_.wait(lock, [&] { return job.done; });
  }

 private:
  struct Job {
    const std::function<void()>* run;
    bool done = false;
  };
  Forker() {
    std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        Job* job = jobs_.front();
        jobs_.pop_front();
        (*job->run)();
        job->done = true;
        cv_.notify_all();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> jobs_;  // waiting to run, in the order asked
};

}  // namespace

std::string KomputedBinary() { return FromEnv("KOMPUTED_BINARY", KOMPUTED_BINARY); }

std::string KomputectlBinary() { return FromEnv("KOMPUTECTL_BINARY", KOMPUTECTL_BINARY); }

pid_t Spawn(const std::vector<std::string>& argv, int* stdout_read, int stderr_fd) {
  if (argv.empty()) return -1;
  // What the child needs is made before fork: between fork and exec it only calls dup2 and exec.
  std::vector<std::string> args = argv;
  std::vector<char*> raw;
  for (auto& a : args) raw.push_back(a.data());
  raw.push_back(nullptr);
  const std::string failure = "execv " + args[0];
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return -1;
  const pid_t parent = getpid();
  pid_t pid = -1;
  Forker::Get().Run([&] {
    pid = fork();
    if (pid != 0) return;
    // The child ends with this process (SIGTERM), even where it is killed; a parent gone before
    // the signal was asked for is seen as a new parent.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    // dup2 clears close-on-exec on the copies; every other pipe end closes at exec.
    dup2(out[1], STDOUT_FILENO);
    if (stderr_fd != STDERR_FILENO) dup2(stderr_fd, STDERR_FILENO);
    execv(raw[0], raw.data());
    std::perror(failure.c_str());
    _exit(127);
  });
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    return -1;
  }
  *stdout_read = out[0];
  return pid;
}

std::string ReadLine(int fd, absl::Time deadline) {
  std::string line;
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, std::max(ms, 1)) <= 0) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (absl::Now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err,
               absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return -1;
  int out_read = -1;
  const pid_t pid = Spawn(argv, &out_read, err_pipe[1]);
  close(err_pipe[1]);
  if (pid < 0) {
    close(err_pipe[0]);
    return -1;
  }
  out->clear();
  err->clear();
  pollfd fds[2] = {{out_read, POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open_fds = 2;
  while (open_fds > 0 && absl::Now() < until) {
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  const int status = WaitExit(pid, until - absl::Now());
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool AcceptsOnLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_in addr = Loopback(port);
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace komputed::test_support
