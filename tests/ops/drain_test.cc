// The graceful drain of the real daemon on SIGTERM and SIGINT: health turns NOT_SERVING, new
// sessions and evaluations are refused with UNAVAILABLE, every evaluation accepted before
// completes with the right result, and the process exits 0.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "test_util.h"

namespace komputed::ops_testing {
namespace {

// The slow pipelines run kSlowShader over this many elements (one invocation each).
constexpr uint32_t kSlowCount = 2048;

std::vector<uint32_t> SlowInput() {
  std::vector<uint32_t> input(kSlowCount);
  for (uint32_t i = 0; i < kSlowCount; ++i) input[i] = 1000 + i;
  return input;
}

// Checks a slow eval's output at a few elements (the CPU is slower at this than the device).
void ExpectSlowOutput(const v1::EvalResponse& resp, const test_support::SlowWork& work) {
  ASSERT_EQ(resp.downloads_size(), 1);
  const std::vector<uint32_t> out = Uints(resp.downloads(0).data());
  ASSERT_EQ(out.size(), kSlowCount);
  for (uint32_t i : {0u, kSlowCount - 1}) {
    EXPECT_EQ(out[i], test_support::Lcg(1000 + i, work)) << "element " << i;
  }
}

// kSlowShader work that takes about `target` on this device (measured with throw-away
// pipelines from handle 900 on; the first eval of each also pays for the JIT).
test_support::SlowWork WorkFor(Client& client, const std::string& session, absl::Duration target) {
  uint64_t h = 900;
  return test_support::SlowWorkFor(target, DeviceIsCpu(client), [&](test_support::SlowWork work) {
    MakeSlowPipeline(client, session, h, kSlowCount, work);
    v1::EvalResponse resp;
    EXPECT_THAT(client.Eval(SlowEval(session, h, SlowInput()), &resp), IsOk());
    // The fastest of two: a probe slowed down by something else would make the eval too short.
    double seconds = 1e9;
    for (int i = 0; i < 2; ++i) {
      const absl::Time start = absl::Now();
      EXPECT_THAT(client.Eval(SlowEval(session, h, SlowInput()), &resp), IsOk());
      seconds = std::min(seconds, absl::ToDoubleSeconds(absl::Now() - start));
    }
    h += 3;
    return seconds;
  });
}

// Polls the daemon's metrics until queue_depth{device 0, queue 0} is `depth`.
bool WaitForQueueDepth(const DaemonProcess& daemon, double depth, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    const Samples s = Samples::From(daemon);
    if (s.Get("komputed_queue_depth", {{"device", "0"}, {"queue", "0"}}) == depth) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// What one looping client saw.
struct Tally {
  int ok = 0;
  int refused = 0;                  // UNAVAILABLE at submission: not accepted
  std::vector<std::string> errors;  // anything else: an accepted eval that did not complete well
  std::string refusal;              // the message of the first refusal
};

// Loopers run evals until one is refused; they park between evals while `paused`.
class Loopers {
 public:
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  // Waits until `n` loopers are parked.
  bool WaitParked(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto parked = [&]() { return parked_ == n; };
    return mu_.AwaitWithTimeout(absl::Condition(&parked), timeout);
  }
  // Waits until every tally has at least `ok` results.
  bool WaitOk(const std::vector<Tally>& tallies, int ok, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() {
      return std::all_of(tallies.begin(), tallies.end(),
                         [&](const Tally& t) { return t.ok >= ok; });
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  // Called by a looper before each eval.
  void Checkpoint() {
    absl::MutexLock lock(&mu_);
    if (!paused_) return;
    ++parked_;
    mu_.Await(absl::Condition(
        +[](bool* paused) { return !*paused; }, &paused_));
    --parked_;
  }
  // Records a result under the lock; true while the looper should go on.
  bool Record(Tally& tally, int code, const std::string& message, bool correct) {
    absl::MutexLock lock(&mu_);
    if (code == 0 && correct) {
      ++tally.ok;
      return true;
    }
    if (code == static_cast<int>(grpc::StatusCode::UNAVAILABLE)) {
      ++tally.refused;
      if (tally.refusal.empty()) tally.refusal = message;
      return false;
    }
    tally.errors.push_back(code == 0 ? "wrong result" : absl::StrCat("code ", code, ": ", message));
    return false;
  }

 private:
  absl::Mutex mu_;
  bool paused_ = false;
  int parked_ = 0;
};

TEST(Drain, AcceptedEvaluationsCompleteAndTheDaemonExitsZero) {
  DaemonProcess daemon({"--drain_timeout=30s"});
  ASSERT_TRUE(daemon.started());
  Client setup(daemon.address());
  std::string slow_session;
  ASSERT_THAT(setup.Open(&slow_session, "slow"), IsOk());
  const test_support::SlowWork work = WorkFor(setup, slow_session, absl::Milliseconds(1500));
  MakeSlowPipeline(setup, slow_session, 1, kSlowCount, work);

  constexpr int kUnary = 3;
  constexpr int kStreams = 1;
  constexpr uint32_t kN = 256;
  std::vector<Tally> tallies(kUnary + kStreams);
  Loopers loopers;
  std::vector<std::thread> threads;
  std::thread slow;
  // When an assertion returns early: stop the daemon so that every client's call ends, and join.
  struct Cleanup {
    std::function<void()> fn;
    ~Cleanup() { fn(); }
  } cleanup{[&] {
    if (daemon.pid() > 0) kill(daemon.pid(), SIGKILL);
    loopers.Resume();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    if (slow.joinable()) slow.join();
  }};
  for (int c = 0; c < kUnary + kStreams; ++c) {
    std::string session;
    ASSERT_THAT(setup.Open(&session, absl::StrCat("looper-", c)), IsOk());
    MakeScalePipeline(setup, session, 1, kN, static_cast<float>(c + 2));
    threads.emplace_back([&, c, session] {
      Client client(daemon.address());
      const float scale = static_cast<float>(c + 2);
      std::unique_ptr<grpc::ClientContext> stream_ctx;
      std::unique_ptr<grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteEvent>> stream;
      const bool streaming = c >= kUnary;
      if (streaming) {
        stream_ctx = std::make_unique<grpc::ClientContext>();
        stream = client.sequences->Execute(stream_ctx.get());
      }
      for (int i = 0;; ++i) {
        loopers.Checkpoint();
        std::vector<float> input(kN);
        for (uint32_t k = 0; k < kN; ++k) input[k] = static_cast<float>(i * 1000 + k);
        v1::EvalRequest req = ScaleEval(session, 1, input);
        int code = 0;
        std::string message;
        v1::EvalResponse result;
        if (streaming) {
          req.set_request_id(static_cast<uint64_t>(i) + 1);
          v1::ExecuteRequest request;
          *request.mutable_eval() = req;
          v1::ExecuteEvent event;
          if (!stream->Write(request) || !stream->Read(&event)) {
            loopers.Record(tallies[c], -1, "the Execute stream broke before the event came", false);
            break;
          }
          code = event.code();
          message = event.message();
          result = event.result();
          if (event.request_id() != req.request_id()) {
            loopers.Record(tallies[c], -1, "an event for another request", false);
            break;
          }
        } else {
          grpc::Status s = client.Eval(req, &result);
          code = static_cast<int>(s.error_code());
          message = s.error_message();
        }
        bool correct = false;
        if (code == 0 && result.downloads_size() == 1) {
          const std::vector<float> out = Floats(result.downloads(0).data());
          correct = out.size() == kN;
          for (uint32_t k = 0; correct && k < kN; ++k) correct = out[k] == input[k] * scale;
        }
        if (!loopers.Record(tallies[c], code, message, correct)) break;
      }
      if (streaming) {
        stream->WritesDone();
        stream->Finish();  // OK, or cancelled as the daemon stops: both fine here
      }
    });
  }

  // Every looper gets going, then parks; the slow eval starts alone (so the queue's one
  // submission in flight is it); the loopers' next evals queue up behind it; then SIGTERM.
  ASSERT_TRUE(loopers.WaitOk(tallies, 3, absl::Seconds(30)));
  loopers.Pause();
  ASSERT_TRUE(loopers.WaitParked(kUnary + kStreams, absl::Seconds(30)));
  grpc::Status slow_status;
  v1::EvalResponse slow_result;
  slow = std::thread([&] {
    Client client(daemon.address());
    slow_status = client.Eval(SlowEval(slow_session, 1, SlowInput()), &slow_result);
  });
  ASSERT_TRUE(WaitForQueueDepth(daemon, 1, absl::Seconds(30)));
  loopers.Resume();
  ASSERT_TRUE(WaitForQueueDepth(daemon, 1 + kUnary + kStreams, absl::Seconds(30)))
      << "the loopers' evals did not queue up behind the slow one";
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);

  // While the slow eval runs, the daemon drains: NOT_SERVING, no new sessions.
  ASSERT_TRUE(daemon.WaitForLog("komputed draining", absl::Seconds(30))) << daemon.Log();
  Client late(daemon.address());
  grpc::Status health_status;
  EXPECT_EQ(late.Health("", &health_status), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_THAT(health_status, IsOk());
  std::string refused_session;
  grpc::Status open = late.Open(&refused_session, "late");
  EXPECT_THAT(open, HasCode(grpc::StatusCode::UNAVAILABLE));
  EXPECT_THAT(open.error_message(), testing::HasSubstr("komputed is draining"));

  slow.join();
  for (auto& t : threads) t.join();
  const int status = daemon.WaitExit(absl::Seconds(30));
  EXPECT_THAT(slow_status, IsOk());
  ExpectSlowOutput(slow_result, work);
  for (int c = 0; c < kUnary + kStreams; ++c) {
    SCOPED_TRACE(absl::StrCat("looper ", c));
    EXPECT_THAT(tallies[c].errors, testing::IsEmpty());
    EXPECT_GE(tallies[c].ok, 4);  // 3 before the pause, 1 queued behind the slow eval
    EXPECT_EQ(tallies[c].refused, 1);
  }
  EXPECT_THAT(tallies[0].refusal, testing::HasSubstr("komputed is draining"));

  ASSERT_NE(status, -1) << "komputed did not exit; log:\n" << daemon.Log();
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status << "; log:\n" << daemon.Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string log = daemon.Log();
  EXPECT_THAT(log, testing::HasSubstr("SIGTERM received"));
  EXPECT_THAT(log, testing::HasSubstr("komputed drained in"));
  EXPECT_THAT(log, testing::HasSubstr("reaped: the daemon is stopping"));
  EXPECT_THAT(log, testing::HasSubstr("komputed stopped"));
}

TEST(Drain, TimeoutBoundsTheWait) {
  DaemonProcess daemon({"--drain_timeout=0.2s"});
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  const test_support::SlowWork work = WorkFor(client, session, absl::Milliseconds(1500));
  MakeSlowPipeline(client, session, 1, kSlowCount, work);
  std::thread slow([&] {
    Client c(daemon.address());
    v1::EvalResponse resp;
    c.Eval(SlowEval(session, 1, SlowInput()), &resp);  // OK or CANCELLED, depending on timing
  });
  struct Cleanup {
    std::function<void()> fn;
    ~Cleanup() { fn(); }
  } cleanup{[&] {
    if (daemon.pid() > 0) kill(daemon.pid(), SIGKILL);
    if (slow.joinable()) slow.join();
  }};
  ASSERT_TRUE(WaitForQueueDepth(daemon, 1, absl::Seconds(30)));
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(daemon.pid(), SIGTERM), 0);
  const int status = daemon.WaitExit(absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status << "; log:\n" << daemon.Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(daemon.Log(),
              testing::HasSubstr("drain timeout (200ms): 1 evaluation(s) still in flight"));
  // The daemon stops waiting for the evaluation after the drain timeout (its call is cancelled
  // unless it completes within the final second), but it frees the device memory only once the
  // GPU is done with it: it exits when the submission has completed.
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(Drain, SigintDrainsLikeSigterm) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.started());
  Client client(daemon.address());
  std::string session;
  ASSERT_THAT(client.Open(&session), IsOk());
  const int status = daemon.Stop(SIGINT, absl::Seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string log = daemon.Log();
  EXPECT_THAT(log, testing::HasSubstr("SIGINT received"));
  EXPECT_THAT(log, testing::HasSubstr("health: NOT_SERVING"));
  EXPECT_THAT(log, testing::HasSubstr("komputed drained in"));
  EXPECT_THAT(log, testing::HasSubstr(absl::StrCat("session ", session.substr(0, 8),
                                                   " of tenant default reaped")));
}

}  // namespace
}  // namespace komputed::ops_testing
