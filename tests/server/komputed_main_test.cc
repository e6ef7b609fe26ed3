// The real daemon binary: prints its address, serves, and stops cleanly on SIGTERM.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "test_util.h"

namespace komputed::server::testing {
namespace {

// Reads one line from `fd` within `timeout`; empty on timeout or EOF.
std::string ReadLine(int fd, absl::Duration timeout) {
  std::string line;
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now())));
    if (ready <= 0) break;
    char c;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

// Waits for the child within `timeout`; its wait status, or -1 when it did not exit.
int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

TEST(KomputedBinary, PrintsItsAddressServesAndStopsOnSigterm) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl(KOMPUTED_BINARY, KOMPUTED_BINARY, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
          "--log_level=warning", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  const std::string line = ReadLine(out[0], absl::Seconds(30));
  const std::string prefix = "komputed listening on 127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << "first line: '" << line << "'";
  const int port = std::stoi(line.substr(prefix.size()));
  EXPECT_GT(port, 0);

  Client client(absl::StrCat("127.0.0.1:", port));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PingRequest req;
  req.set_payload("x");
  v1::PingResponse resp;
  EXPECT_THAT(client.sessions->Ping(&ctx, req, &resp), IsOk());

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitExit(pid, absl::Seconds(20));
  close(out[0]);
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "komputed did not stop within 20 s of SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(KomputedBinary, BadFlagValueFailsToStart) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
    execl(KOMPUTED_BINARY, KOMPUTED_BINARY, "--listen=127.0.0.1:0",
          "--metrics_listen=", "--devices=99", static_cast<char*>(nullptr));
    _exit(127);
  }
  const int status = WaitExit(pid, absl::Seconds(30));
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

}  // namespace
}  // namespace komputed::server::testing
