// The real daemon binary: prints its address, serves, and stops cleanly on SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "support/process.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

TEST(KomputedBinary, PrintsItsAddressServesAndStopsOnSigterm) {
  int out = -1;
  const pid_t pid = Spawn({KomputedBinary(), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                           "--log_level=warning"},
                          &out);
  ASSERT_GE(pid, 0);
  const std::string line = ReadLine(out, absl::Now() + absl::Seconds(30));
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
  close(out);
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "komputed did not stop within 20 s of SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(KomputedBinary, BadFlagValueFailsToStart) {
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int out = -1;
  const pid_t pid =
      Spawn({KomputedBinary(), "--listen=127.0.0.1:0", "--metrics_listen=", "--devices=99"}, &out,
            devnull);
  close(devnull);
  ASSERT_GE(pid, 0);
  const int status = WaitExit(pid, absl::Seconds(30));
  close(out);
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

}  // namespace
}  // namespace komputed::server::testing
