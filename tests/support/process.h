#pragma once
// Programs run by the tests as child processes: where the komputed and komputectl binaries are,
// starting a program with its stdout on a pipe, reading that pipe a line at a time, waiting for
// an exit, and running a program to its end. Every function may be called from any thread.

#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace komputed::test_support {

// $KOMPUTED_BINARY when set and not empty, else the komputed that this build made.
std::string KomputedBinary();
// $KOMPUTECTL_BINARY when set and not empty, else the komputectl that this build made.
std::string KomputectlBinary();

// Starts `argv` (argv[0]: the program's path) in a child process whose stdout is a new pipe and
// whose stderr is `stderr_fd`. Returns the child's pid and stores the pipe's read end, which the
// caller closes, in *stdout_read; -1 (and no pipe) when no child could be started. A program that
// cannot be executed exits with status 127.
pid_t Spawn(const std::vector<std::string>& argv, int* stdout_read, int stderr_fd = STDERR_FILENO);

// Reads one line from `fd` (without its '\n') until `deadline`; what came so far on timeout or at
// end of file.
std::string ReadLine(int fd, absl::Time deadline);

// Waits up to `timeout` for the child `pid` to exit: its wait status, or -1 when it still runs.
int WaitExit(pid_t pid, absl::Duration timeout);

// A TCP port on 127.0.0.1 that was free a moment ago (0 when none could be had): for a daemon
// that must know its own port before it starts (--advertise_address).
int FreeLoopbackPort();
// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool AcceptsOnLoopback(int port);

// Runs `argv` (argv[0]: the program's path) to its end, killed after `timeout`: its exit code
// (-1 when it did not exit normally), with its stdout and stderr.
int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err,
               absl::Duration timeout = absl::Seconds(60));

}  // namespace komputed::test_support
