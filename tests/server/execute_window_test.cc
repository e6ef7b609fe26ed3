// Execute's window: a client that sends requests and never reads its events holds at most a window
// of events in the daemon, and the daemon keeps serving everyone else.
#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "support/daemon_process.h"
#include "support/metrics.h"
#include "support/poll.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

constexpr int kWindow = 4;
constexpr uint32_t kEventFloats = (1 << 20) / 4;  // each event brings back 1 MiB
constexpr int kRequests = 200;

// Waits until `condition` holds, looking every 5 ms; false after `timeout`.
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  return test_support::PollUntil(timeout, condition, absl::Milliseconds(5));
}

// The value of `read` once it has stayed the same for `quiet` (the daemon has settled: a window
// that did not hold would keep it growing for seconds); whatever it is after `timeout`.
double Settled(const std::function<double()>& read, absl::Duration quiet, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  double value = read();
  absl::Time since = absl::Now();
  while (absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double now = read();
    if (now != value) {
      value = now;
      since = absl::Now();
    } else if (absl::Now() - since >= quiet) {
      break;
    }
  }
  return value;
}

// Makes tensor 1 of `floats` floats in `session` (device memory) through `client`.
void MakeDownloadTensor(Stubs& client, const std::string& session, uint32_t floats) {
  ASSERT_THAT(CreateTensor(client, FloatTensor(session, 1, std::vector<float>(floats, 1.5f))),
              IsOk());
}

// An Execute request that brings tensor 1 back, with nothing submitted: its event is ready at
// once, so that a stream of them fills the window with events as fast as the daemon reads.
v1::ExecuteRequest DownloadRequest(const std::string& session, uint64_t id) {
  v1::ExecuteRequest req;
  req.mutable_eval()->set_session_id(session);
  req.mutable_eval()->add_downloads(1);
  req.mutable_eval()->set_request_id(id);
  return req;
}

class ExecuteWindowTest : public ServerTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.execute_window = kWindow;
    return options;
  }
};

TEST_F(ExecuteWindowTest, AClientThatDoesNotReadHoldsAtMostAWindowOfEvents) {
  Metrics& m = server_->metrics();
  const std::string session = Open("flood");
  MakeDownloadTensor(*client_, session, kEventFloats);
  const double downloaded_before = m.bytes_transferred_total("download").Value();

  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(stream->Write(DownloadRequest(session, i)));

  // The window fills with events that gRPC cannot send (the client reads none), and then the
  // daemon reads no further request.
  const double window_bytes = kWindow * (4.0 * kEventFloats);
  ASSERT_TRUE(Eventually([&] { return m.execute_queued_bytes().Value() >= window_bytes; },
                         absl::Seconds(30)))
      << m.execute_queued_bytes().Value();

  // Everyone else is served meanwhile, over the same connection too.
  const std::string other = Open("other");
  MakePipeline(other, 1, 256, 3.0f);
  for (int i = 0; i < 20; ++i) ExpectPipelineWorks(other, 1, 256, 3.0f);

  const double queued = Settled([&] { return m.execute_queued_bytes().Value(); },
                                absl::Milliseconds(300), absl::Seconds(30));
  EXPECT_GE(queued, window_bytes);
  EXPECT_LE(queued, window_bytes + kWindow * 1024.0);  // the events' own fields
  // What was evaluated: the window, and what gRPC took off the daemon's hands (the transports'
  // buffers), far from every request.
  const double evaluated =
      (m.bytes_transferred_total("download").Value() - downloaded_before) / (4.0 * kEventFloats) -
      20;  // the other session's evals (a few bytes each; counted as whole events here)
  EXPECT_LT(evaluated, kRequests / 2) << "events made: " << evaluated;

  // Once the client goes, its events go too.
  ctx.TryCancel();
  EXPECT_THAT(stream->Finish(), HasCode(grpc::StatusCode::CANCELLED));
  EXPECT_TRUE(Eventually([&] { return m.execute_queued_bytes().Value() == 0; }, absl::Seconds(30)));
}

TEST_F(ExecuteWindowTest, AClientThatReadsGetsEveryEvent) {
  const std::string session = Open("reader");
  MakeDownloadTensor(*client_, session, 1024);
  grpc::ClientContext ctx;
  auto stream = client_->sequences->Execute(&ctx);
  std::thread writer([&] {
    for (int i = 0; i < kRequests; ++i) {
      if (!stream->Write(DownloadRequest(session, i))) return;
    }
    stream->WritesDone();
  });
  int events = 0;
  v1::ExecuteEvent event;
  while (stream->Read(&event)) {
    EXPECT_EQ(event.code(), 0) << event.message();
    ++events;
  }
  writer.join();
  EXPECT_THAT(stream->Finish(), IsOk());
  EXPECT_EQ(events, kRequests);
  EXPECT_EQ(server_->metrics().execute_queued_bytes().Value(), 0);
}

// The resident memory of process `pid`, in bytes (VmRSS of /proc/PID/status); 0 when unknown.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    uint64_t kib = 0;
    if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &kib)) return kib << 10;
  }
  return 0;
}

// The real daemon with its default window (64): a client that sends 1000 requests for 1 MiB
// events and reads none would make it hold about 1 GiB of events without the window.
TEST(ExecuteWindow, DaemonMemoryStaysBoundedUnderAClientThatDoesNotRead) {
  DaemonProcess daemon({"--log_level=warning"});
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  grpc::ClientContext open_ctx;
  v1::OpenSessionResponse opened;
  ASSERT_THAT(client.sessions->OpenSession(&open_ctx, v1::OpenSessionRequest(), &opened), IsOk());
  const std::string session = opened.session_id();
  MakeDownloadTensor(client, session, kEventFloats);
  const uint64_t before = ResidentBytes(daemon.pid());
  ASSERT_GT(before, 0u);

  grpc::ClientContext ctx;
  auto stream = client.sequences->Execute(&ctx);
  constexpr int kMany = 1000;
  for (int i = 0; i < kMany; ++i) ASSERT_TRUE(stream->Write(DownloadRequest(session, i)));
  const double window_bytes = 64 * (4.0 * kEventFloats);
  ASSERT_TRUE(Eventually(
      [&] { return Samples::From(daemon).Get("komputed_execute_queued_bytes") >= window_bytes; },
      absl::Seconds(60)));
  Settled([&] { return Samples::From(daemon).Get("komputed_execute_queued_bytes"); },
          absl::Milliseconds(300), absl::Seconds(60));
  const uint64_t during = ResidentBytes(daemon.pid());
  const Samples samples = Samples::From(daemon);
  const double made = samples.Get("komputed_bytes_transferred_total", {{"direction", "download"}}) /
                      (4.0 * kEventFloats);
  std::printf(
      "komputed resident memory: %.1f MiB before, %.1f MiB with the stream's window full "
      "(%.0f of %d events made, %.1f MiB queued)\n",
      before / 1048576.0, during / 1048576.0, made, kMany,
      samples.Get("komputed_execute_queued_bytes") / 1048576.0);
  EXPECT_LT(made, kMany / 2);
  // The window's 64 MiB of events, their serialized copies in gRPC, and allocator slack.
  EXPECT_LT(during, before + (256u << 20));

  // Another client of the daemon is served.
  Client other(daemon.address());
  grpc::ClientContext ping_ctx;
  ping_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PingResponse pong;
  EXPECT_THAT(other.sessions->Ping(&ping_ctx, v1::PingRequest(), &pong), IsOk());
  ctx.TryCancel();
  EXPECT_THAT(stream->Finish(), HasCode(grpc::StatusCode::CANCELLED));
}

}  // namespace
}  // namespace komputed::server::testing
