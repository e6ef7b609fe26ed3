#include "glsl_compiler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "komputed/core/shader.h"

namespace komputed::server {
namespace {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat("GLSL compile: ", what, ": ", std::strerror(errno)));
}

// How long a killed child may take to end before it is left to later compiles to reap: a child can
// wait in the kernel beyond any signal (closing a descriptor of a file whose FUSE server does not
// answer, in its exec or exit), and the serving thread must not wait with it.
constexpr absl::Duration kReapGrace = absl::Seconds(2);

ABSL_CONST_INIT absl::Mutex abandoned_mu(absl::kConstInit);
std::vector<pid_t>* abandoned ABSL_GUARDED_BY(abandoned_mu) = new std::vector<pid_t>();

// Reaps the children left behind that have ended since.
void ReapAbandoned() {
  absl::MutexLock lock(&abandoned_mu);
  std::vector<pid_t>& pids = *abandoned;
  pids.erase(std::remove_if(pids.begin(), pids.end(),
                            [](pid_t pid) { return waitpid(pid, nullptr, WNOHANG) != 0; }),
             pids.end());
}

}  // namespace

std::string DefaultGlslCompiler() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "komputed_glslc";
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + "komputed_glslc";
}

absl::StatusOr<std::vector<uint32_t>> CompileGlslInChild(const std::string& compiler,
                                                         absl::string_view source,
                                                         absl::string_view name,
                                                         const GlslCompileLimits& limits) {
  ReapAbandoned();
  // The child's stdin is one end of a socket pair, not a pipe: a send with MSG_NOSIGNAL to a child
  // that exited early fails with EPIPE instead of raising SIGPIPE in the caller's process.
  int in[2], out[2], err[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) != 0) return Errno("socketpair");
  Fd in_read(in[0]), in_write(in[1]);
  if (pipe2(out, O_CLOEXEC) != 0) return Errno("pipe");
  Fd out_read(out[0]), out_write(out[1]);
  if (pipe2(err, O_CLOEXEC) != 0) return Errno("pipe");
  Fd err_read(err[0]), err_write(err[1]);

  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  const std::string name_arg(name);
  char* const argv[] = {const_cast<char*>(compiler.c_str()), const_cast<char*>(name_arg.c_str()),
                        nullptr};
  const rlim_t cpu_seconds =
      static_cast<rlim_t>(absl::ToInt64Seconds(limits.wall_time + absl::Seconds(1)));
  const struct rlimit memory = {limits.memory_bytes, limits.memory_bytes};
  const struct rlimit cpu = {cpu_seconds, cpu_seconds};
  const struct rlimit no_core = {0, 0};
  const pid_t pid = fork();
  if (pid < 0) return Errno("fork");
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (memory.rlim_cur > 0) setrlimit(RLIMIT_AS, &memory);
    setrlimit(RLIMIT_CPU, &cpu);
    setrlimit(RLIMIT_CORE, &no_core);
    execv(compiler.c_str(), argv);
    _exit(127);
  }
  in_read.Close();
  out_write.Close();
  err_write.Close();

  std::string spirv, messages;
  size_t written = 0;
  bool out_open = true, err_open = true, too_big = false, timed_out = false;
  const absl::Time deadline = absl::Now() + limits.wall_time;
  while (out_open || err_open) {
    struct pollfd fds[3];
    nfds_t count = 0;
    const int out_at = out_open ? static_cast<int>(count++) : -1;
    if (out_at >= 0) fds[out_at] = {out_read.get(), POLLIN, 0};
    const int err_at = err_open ? static_cast<int>(count++) : -1;
    if (err_at >= 0) fds[err_at] = {err_read.get(), POLLIN, 0};
    const int in_at = in_write.get() >= 0 ? static_cast<int>(count++) : -1;
    if (in_at >= 0) fds[in_at] = {in_write.get(), POLLOUT, 0};
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int ready =
        poll(fds, count, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (in_at >= 0 && (fds[in_at].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t n = send(in_write.get(), source.data() + written, source.size() - written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN) written = source.size();  // the child is gone
      if (written == source.size()) in_write.Close();         // end of the source
    }
    // Reads what is ready into `into`, keeping at most `cap` bytes (*overflow once more came);
    // false at the end of the stream.
    auto drain = [&](int at, int fd, std::string& into, uint64_t cap, bool* overflow) {
      if (at < 0 || !(fds[at].revents & (POLLIN | POLLERR | POLLHUP))) return true;
      char buffer[65536];
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n <= 0) return false;
      const size_t keep = std::min<uint64_t>(static_cast<uint64_t>(n), cap - into.size());
      into.append(buffer, keep);
      if (keep < static_cast<size_t>(n)) *overflow = true;
      return true;
    };
    bool messages_cut = false;  // the messages are kept only up to their cap
    if (!drain(out_at, out_read.get(), spirv, limits.spirv_bytes, &too_big)) out_open = false;
    if (!drain(err_at, err_read.get(), messages, limits.message_bytes, &messages_cut)) {
      err_open = false;
    }
    if (too_big) break;
  }
  absl::Time killed_at = absl::InfiniteFuture();
  if (timed_out || too_big || out_open || err_open) {
    kill(pid, SIGKILL);
    killed_at = absl::Now();
  }
  // The rest of the source is not sent: a child still reading it sees its end instead of waiting.
  in_write.Close();
  // A child that closed its stdout and stderr may still be running: it too is bounded by the
  // deadline (after it, killed) rather than waited for as long as it lives.
  int status = 0;
  while (true) {
    const pid_t reaped = waitpid(pid, &status, WNOHANG);
    if (reaped == pid || (reaped < 0 && errno != EINTR)) break;
    if (reaped == 0 && absl::Now() >= deadline && !timed_out) {
      timed_out = true;
      kill(pid, SIGKILL);
      killed_at = absl::Now();
    }
    if (reaped == 0 && absl::Now() >= killed_at + kReapGrace) {
      absl::MutexLock lock(&abandoned_mu);
      abandoned->push_back(pid);
      return absl::ResourceExhaustedError(
          absl::StrCat("the GLSL compile of ", name, " was stopped, and its process had not ended ",
                       absl::FormatDuration(kReapGrace), " later"));
    }
    if (reaped == 0) absl::SleepFor(absl::Milliseconds(1));
  }
  if (timed_out) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the GLSL compile of ", name, " did not finish within ",
        absl::FormatDuration(limits.wall_time), " (the daemon's bound); it was stopped"));
  }
  if (too_big) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the GLSL of ", name, " compiles to more than ", limits.spirv_bytes, " bytes of SPIR-V"));
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    if (signal == SIGXCPU || signal == SIGKILL) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the GLSL compile of ", name, " ran out of its CPU time bound and was stopped"));
    }
    if (limits.memory_bytes == 0) {
      return absl::InternalError(absl::StrCat("the GLSL compiler crashed on ", name, " (signal ",
                                              signal, ", ", strsignal(signal),
                                              "); the daemon and other requests are unaffected"));
    }
    // Out of address space shows as an allocation failure: an abort (std::bad_alloc) or a fault.
    return absl::ResourceExhaustedError(
        absl::StrCat("the GLSL compiler failed on ", name, " (signal ", signal, ", ",
                     strsignal(signal), "), most likely out of its ", limits.memory_bytes >> 20,
                     " MiB memory bound; the daemon and other requests are unaffected"));
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0 && spirv.size() % 4 == 0 && !spirv.empty()) {
    std::vector<uint32_t> words(spirv.size() / 4);
    std::memcpy(words.data(), spirv.data(), spirv.size());
    return words;
  }
  if (code == 1) return absl::InvalidArgumentError(messages);  // the compiler's own error text
  if (code == 127) {
    return absl::InternalError(
        absl::StrCat("the GLSL compiler ", compiler, " could not be started"));
  }
  return absl::InternalError(
      absl::StrCat("the GLSL compiler exited with status ", code, " on ", name, ": ", messages));
}

absl::StatusOr<std::vector<uint32_t>> CompileClientGlsl(const std::string& compiler,
                                                        const GlslCompileLimits& limits,
                                                        absl::string_view source,
                                                        absl::string_view name) {
  if (compiler.empty()) return core::CompileGlsl(source, name);
  return CompileGlslInChild(compiler, source, name, limits);
}

}  // namespace komputed::server
