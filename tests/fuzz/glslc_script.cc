// fuzz_glslc_script: the child that fuzz_glsl_pipe has CompileGlslInChild run in place of
// komputed_glslc. It reads the script at the start of its stdin (glslc_script.h) and does what it
// says; at the end of the script it exits with status 0. Built without sanitizers: it stands for
// a compiler, and starts in a millisecond.
#include "glslc_script.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace {

void WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) return;  // closed, or the parent is gone
    done += static_cast<size_t>(n);
  }
}

// Reads up to `most` bytes of stdin (fewer at its end).
std::string Read(size_t most) {
  std::string bytes;
  char buffer[4096];
  while (bytes.size() < most) {
    const size_t want = std::min(sizeof(buffer), most - bytes.size());
    const ssize_t n = read(STDIN_FILENO, buffer, want);
    if (n <= 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

int64_t NowMs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

}  // namespace

int main() {
  using komputed::fuzz::ScriptStep;
  std::string header = Read(1);
  if (!header.empty()) header += Read(komputed::fuzz::ScriptBytes(header[0]) - 1);
  size_t out = 0, err = 0;
  int budget_ms = komputed::fuzz::kMaxScriptMs;
  for (const ScriptStep& step : komputed::fuzz::ParseScript(header)) {
    switch (step.kind) {
      case ScriptStep::kRead:
        Read(size_t{step.amount} * 64);
        break;
      case ScriptStep::kOut: {
        std::string bytes;
        for (int i = 0; i < step.amount * 16; ++i) bytes += komputed::fuzz::ScriptOutByte(out++);
        WriteAll(STDOUT_FILENO, bytes);
        break;
      }
      case ScriptStep::kErr: {
        std::string bytes;
        for (int i = 0; i < step.amount * 4; ++i) bytes += komputed::fuzz::ScriptErrByte(err++);
        WriteAll(STDERR_FILENO, bytes);
        break;
      }
      case ScriptStep::kCloseIn:
        close(STDIN_FILENO);
        break;
      case ScriptStep::kCloseOut:
        close(STDOUT_FILENO);
        break;
      case ScriptStep::kCloseErr:
        close(STDERR_FILENO);
        break;
      case ScriptStep::kSleep: {
        const int ms = std::min(step.amount * 4, budget_ms);
        budget_ms -= ms;
        usleep(static_cast<useconds_t>(ms) * 1000);
        break;
      }
      case ScriptStep::kSpin: {
        const int ms = std::min<int>(step.amount, budget_ms);
        budget_ms -= ms;
        const int64_t end = NowMs() + ms;
        while (NowMs() < end) {
        }
        break;
      }
      case ScriptStep::kExit:
        _exit(komputed::fuzz::ScriptExitCode(step.amount));
      case ScriptStep::kSignal:
        signal(komputed::fuzz::ScriptSignal(step.amount), SIG_DFL);
        raise(komputed::fuzz::ScriptSignal(step.amount));
        _exit(3);  // not reached
      case ScriptStep::kKinds:
        break;
    }
  }
  return 0;
}
