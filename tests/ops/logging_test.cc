// The daemon's log (stderr) and flags: a line per session open, close and reap, failed calls
// with their session id at a level that fits the fault, --log_level, --help, and a metrics
// port that cannot be bound.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "test_util.h"

namespace komputed::ops_testing {
namespace {

// The log lines that contain `text`.
std::vector<std::string> LinesWith(const std::string& log, const std::string& text) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, text)) lines.emplace_back(line);
  }
  return lines;
}

grpc::Status DestroyTensor(Client& client, const std::string& session, uint64_t handle) {
  grpc::ClientContext ctx;
  v1::DestroyTensorRequest req;
  req.set_session_id(session);
  req.set_handle(handle);
  v1::DestroyTensorResponse resp;
  return client.tensors->DestroyTensor(&ctx, req, &resp);
}

// How the log names a session: the first 8 hex digits of its id.
std::string Logged(const std::string& session) { return session.substr(0, 8); }

TEST(Logging, SessionsAndClientErrorsAtDebug) {
  DaemonProcess daemon({"--log_level=debug"});
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session, "logging-test"), IsOk());
  EXPECT_THAT(DestroyTensor(client, session, 42), HasCode(grpc::StatusCode::NOT_FOUND));
  ASSERT_THAT(client.Close(session), IsOk());
  ASSERT_TRUE(daemon.WaitForLog(
      absl::StrCat("session ", Logged(session), " of tenant default closed"), absl::Seconds(10)));

  const std::string log = daemon.Log();
  const auto opened = LinesWith(log, absl::StrCat("session ", Logged(session), " opened"));
  ASSERT_EQ(opened.size(), 1u) << log;
  EXPECT_THAT(opened[0], testing::HasSubstr("[info]"));
  EXPECT_THAT(opened[0], testing::HasSubstr("logging-test"));
  EXPECT_THAT(opened[0], testing::HasSubstr("for tenant default"));
  // The whole id, which lets its tenant use the session, is not written to the log.
  EXPECT_THAT(log, testing::Not(testing::HasSubstr(session)));
  const auto failed = LinesWith(log, "DestroyTensor failed");
  ASSERT_EQ(failed.size(), 1u) << log;
  EXPECT_THAT(failed[0], testing::HasSubstr("[debug]"));
  EXPECT_THAT(failed[0], testing::HasSubstr(absl::StrCat("in session ", Logged(session), ":")));
  EXPECT_THAT(failed[0], testing::HasSubstr("NOT_FOUND: tensor 42 not found"));
  const auto closed = LinesWith(
      log, absl::StrCat("session ", Logged(session), " of tenant default closed by its client"));
  ASSERT_EQ(closed.size(), 1u) << log;
  EXPECT_THAT(closed[0], testing::HasSubstr("[info]"));
}

TEST(Logging, InfoLevelLeavesClientErrorsOut) {
  DaemonProcess daemon({"--log_level=info"});
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  EXPECT_THAT(DestroyTensor(client, session, 42), HasCode(grpc::StatusCode::NOT_FOUND));
  ASSERT_THAT(client.Close(session), IsOk());
  ASSERT_TRUE(daemon.WaitForLog(
      absl::StrCat("session ", Logged(session), " of tenant default closed"), absl::Seconds(10)));
  const std::string log = daemon.Log();
  EXPECT_THAT(LinesWith(log, "DestroyTensor failed"), testing::IsEmpty()) << log;
  EXPECT_THAT(LinesWith(log, "[debug]"), testing::IsEmpty()) << log;
  EXPECT_EQ(LinesWith(log, absl::StrCat("session ", Logged(session), " opened")).size(), 1u) << log;
}

TEST(Logging, IdleSessionIsReapedLoggedAndCounted) {
  DaemonProcess daemon({"--session_idle_timeout=0.3s"});
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  ASSERT_THAT(client.CreateTensor(FloatTensor(session, 1, std::vector<float>(8, 1.0f))), IsOk());
  ASSERT_TRUE(daemon.WaitForLog(
      absl::StrCat("session ", Logged(session), " of tenant default reaped"), absl::Seconds(10)))
      << daemon.Log();
  const Samples s = Samples::From(daemon);
  EXPECT_EQ(s.Get("komputed_sessions_reaped_total", {{"reason", "idle"}}), 1);
  EXPECT_EQ(s.Get("komputed_sessions_open"), 0);
  EXPECT_EQ(s.Get("komputed_device_memory_used_bytes", {{"device", "0"}}), 0);
}

TEST(Flags, HelpDocumentsEveryFlag) {
  std::string out, err;
  RunProgram({KomputedBinary(), "--help"}, &out, &err);
  const std::string help = out + err;
  for (const char* flag :
       {"listen", "metrics_listen", "devices", "session_idle_timeout", "eval_timeout",
        "eval_inline_wait", "eval_spin", "eval_hold", "grpc_threads", "eval_poll", "drain_timeout",
        "max_message_bytes", "log_level"}) {
    // absl writes "--name (help text); default: value;".
    const std::string entry = absl::StrCat("--", flag, " (");
    const size_t at = help.find(entry);
    ASSERT_NE(at, std::string::npos) << flag << " is not in --help:\n" << help;
    const size_t end = help.find("); default: ", at);
    ASSERT_NE(end, std::string::npos) << flag;
    EXPECT_GT(end - at - entry.size(), 20u) << flag << " has (almost) no help text";
  }
  EXPECT_THAT(help, testing::HasSubstr("default: \"127.0.0.1:9464\""));
  EXPECT_THAT(help, testing::HasSubstr("default: 25s"));
}

TEST(Flags, MetricsPortInUseFailsToStart) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  std::string out, err;
  const int code = RunProgram(
      {KomputedBinary(), "--listen=127.0.0.1:0", absl::StrCat("--metrics_listen=127.0.0.1:", port)},
      &out, &err);
  close(fd);
  EXPECT_EQ(code, 1) << err;
  EXPECT_THAT(err, testing::HasSubstr(absl::StrCat("cannot serve metrics on 127.0.0.1:", port)));
  EXPECT_THAT(out, testing::Not(testing::HasSubstr("komputed listening")));
}

TEST(Flags, EmptyMetricsListenPrintsOnlyTheListeningLine) {
  int out = -1;
  const pid_t pid = Spawn(
      {KomputedBinary(), "--listen=127.0.0.1:0", "--metrics_listen=", "--log_level=off"}, &out);
  ASSERT_GE(pid, 0);
  std::string text;
  char buf[256];
  ssize_t n;
  // The first line comes once the daemon serves; then SIGTERM, and stdout ends at its exit.
  while (text.find('\n') == std::string::npos && (n = read(out, buf, sizeof(buf))) > 0) {
    text.append(buf, static_cast<size_t>(n));
  }
  kill(pid, SIGTERM);
  while ((n = read(out, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(out);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << text;
  EXPECT_THAT(lines[0], testing::StartsWith("komputed listening on 127.0.0.1:"));
}

}  // namespace
}  // namespace komputed::ops_testing
