// The daemon on a Unix socket: the address it reports, the socket file's mode and group, and the
// file's removal when the daemon goes.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "support/process.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::HasSubstr;

// A fresh folder for the test's socket, removed at its end.
class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char folder[] = "/tmp/komputed-unix-XXXXXX";
    ASSERT_NE(mkdtemp(folder), nullptr);
    folder_ = folder;
    path_ = folder_ + "/komputed.sock";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(folder_.c_str());
  }

  bool Exists() const {
    struct stat st;
    return lstat(path_.c_str(), &st) == 0;
  }
  mode_t Mode() const {
    struct stat st;
    return lstat(path_.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
  }

  // A ping over the socket.
  static grpc::Status Ping(const std::string& address) {
    Client client(address);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PingRequest req;
    req.set_payload("x");
    v1::PingResponse resp;
    return client.sessions->Ping(&ctx, req, &resp);
  }

  std::string folder_;
  std::string path_;
};

TEST_F(UnixSocketTest, ServesOnTheSocketWithItsModeAndGroupAndRemovesIt) {
  ServerOptions options = TestServerOptions();
  options.listen = "unix:" + path_;
  options.listen_socket_mode = 0660;
  options.listen_socket_group = std::to_string(getegid());
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->address(), "unix:" + path_);
  EXPECT_TRUE(Exists());
  EXPECT_EQ(Mode(), 0660u);
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, getegid());
  EXPECT_THAT(Ping((*server)->address()), IsOk());
  (*server)->Shutdown();
  server->reset();
  EXPECT_FALSE(Exists()) << path_ << " is still there after the daemon has gone";
}

TEST_F(UnixSocketTest, TheTripleSlashFormNamesTheSameFile) {
  ServerOptions options = TestServerOptions();
  options.listen = "unix://" + path_;  // unix:///tmp/...
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Exists());
  EXPECT_THAT(Ping((*server)->address()), IsOk());
  server->reset();
  EXPECT_FALSE(Exists());
}

TEST_F(UnixSocketTest, BadSocketSettingsAreRefused) {
  ServerOptions tcp;
  tcp.listen = "127.0.0.1:0";
  tcp.listen_socket_mode = 0600;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(tcp);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("unix:PATH"));

  ServerOptions group;
  group.listen = "unix:" + path_;
  group.listen_socket_group = "no-such-group-komputed";
  server = Server::Start(group);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("no-such-group-komputed"));
  EXPECT_FALSE(Exists()) << "a daemon that failed to start left its socket file";
}

TEST_F(UnixSocketTest, TheBinaryPrintsThePathAndRemovesTheSocketOnSigterm) {
  int out = -1;
  const pid_t pid = Spawn({KomputedBinary(), "--listen=unix:" + path_, "--listen_socket_mode=0600",
                           "--metrics_listen=", "--log_level=warning"},
                          &out);
  ASSERT_GE(pid, 0);
  const std::string line = ReadLine(out, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(line, "komputed listening on unix:" + path_);
  EXPECT_EQ(Mode(), 0600u);
  EXPECT_THAT(Ping("unix:" + path_), IsOk());
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitExit(pid, absl::Seconds(20));
  close(out);
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "komputed did not stop within 20 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  EXPECT_FALSE(Exists());
}

TEST_F(UnixSocketTest, TheBinaryRefusesABadMode) {
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int out = -1;
  const pid_t pid = Spawn({KomputedBinary(), "--listen=unix:" + path_, "--listen_socket_mode=0999",
                           "--metrics_listen="},
                          &out, devnull);
  close(devnull);
  ASSERT_GE(pid, 0);
  const int status = WaitExit(pid, absl::Seconds(30));
  close(out);
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "wait status " << status;
  EXPECT_FALSE(Exists());
}

}  // namespace
}  // namespace komputed::server::testing
