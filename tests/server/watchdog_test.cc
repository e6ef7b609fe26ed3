// The kernel watchdog: a session whose kernel runs past --max_kernel_time is stopped and closed,
// while health, other sessions' setup and their evaluations keep working.

#include "watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "support/slow_kernel.h"
#include "test_util.h"

namespace komputed::server::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class WatchdogTest : public ServerTest {
 protected:
  static constexpr absl::Duration kLimit = absl::Seconds(4);
  ServerOptions Options() override {
    ServerOptions options = ServerTest::Options();
    options.max_kernel_time = kLimit;
    return options;
  }

  uint64_t MemoryInUse() {
    grpc::ClientContext ctx;
    v1::ListDevicesResponse resp;
    EXPECT_THAT(client_->devices->ListDevices(&ctx, v1::ListDevicesRequest(), &resp), IsOk());
    return resp.devices_size() > 0 ? resp.devices(0).memory_in_use_bytes() : 0;
  }
};

TEST_F(WatchdogTest, ARunawayKernelIsStoppedAndTheDaemonKeepsServing) {
  const uint64_t baseline = MemoryInUse();
  // The runaway: a loop without end on a GPU, and hours of work on lavapipe (65535 x 64
  // workgroups of 64 invocations, each looping as long as lavapipe lets it).
  const std::string a = Open("runaway");
  ASSERT_THAT(CreateTensor(FloatTensor(a, 1, std::vector<float>(1024, 0.0f))), IsOk());
  uint32_t iterations = 0;
  std::string push(4, '\0');
  std::memcpy(push.data(), &iterations, 4);
  v1::CreateAlgorithmRequest algorithm = GlslAlgorithm(a, 2, {1}, kRunawayShader, 65535, push);
  algorithm.mutable_workgroup()->set_y(64);
  ASSERT_THAT(CreateAlgorithm(algorithm), IsOk());
  ASSERT_THAT(CreateSequence(a, 3), IsOk());
  ASSERT_THAT(Record(a, 3, {RecordOp(Dispatch(2))}), IsOk());
  EXPECT_GT(MemoryInUse(), baseline);

  std::atomic<bool> runaway_done{false};
  grpc::Status runaway;
  absl::Duration runaway_took;
  std::thread eval([&] {
    v1::EvalRequest req;
    req.set_session_id(a);
    req.set_sequence(3);
    v1::EvalResponse resp;
    const absl::Time start = absl::Now();
    runaway = Eval(req, &resp);
    runaway_took = absl::Now() - start;
    runaway_done = true;
  });
  absl::Cleanup join = [&] {
    if (eval.joinable()) eval.join();
  };
  absl::SleepFor(absl::Milliseconds(500));  // the kernel runs

  // While it runs: health answers, another session opens, creates tensors, an algorithm and a
  // sequence. All of it is done before the watchdog has stopped the runaway.
  const absl::Time start = absl::Now();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::health::v1::HealthCheckResponse resp;
    auto health = grpc::health::v1::Health::NewStub(client_->channel);
    EXPECT_THAT(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp), IsOk());
  }
  const std::string b = Open("neighbour");
  MakePipeline(b, 10, 4, 3.0f);
  const absl::Duration setup = absl::Now() - start;
  EXPECT_FALSE(runaway_done.load())
      << "the neighbour's setup waited for the runaway kernel (" << setup << ")";
  std::printf("health, open, 2 tensors, an algorithm and a sequence took %s during the runaway\n",
              absl::FormatDuration(setup).c_str());

  // The neighbour's eval shares lavapipe's one queue: it completes once the runaway is stopped.
  v1::EvalResponse resp;
  ASSERT_THAT(Eval(PipelineEval(b, 10, {1, 2, 3, 4}), &resp), IsOk());
  ASSERT_EQ(resp.downloads_size(), 1);
  EXPECT_THAT(Floats(resp.downloads(0).data()), ElementsAre(3, 6, 9, 12));

  eval.join();
  EXPECT_THAT(runaway, HasCode(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(runaway.error_message(), HasSubstr("watchdog"));
  EXPECT_THAT(runaway.error_message(), HasSubstr(absl::FormatDuration(kLimit)));
  std::printf("the runaway's eval ended after %s (limit %s)\n",
              absl::FormatDuration(runaway_took).c_str(), absl::FormatDuration(kLimit).c_str());
  EXPECT_GE(runaway_took, kLimit);

  // The runaway's session is closed, and its client is told why.
  grpc::Status after = CreateTensor(FloatTensor(a, 4, {1}));
  EXPECT_THAT(after, HasCode(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(after.error_message(), HasSubstr("closed by the daemon"));
  EXPECT_THAT(after.error_message(), HasSubstr("max_kernel_time"));
  // The neighbour keeps working; the runaway's memory is given back once its submission has
  // ended: what the device holds is the neighbour's alone.
  v1::EvalResponse again;
  ASSERT_THAT(Eval(PipelineEval(b, 10, {5, 6, 7, 8}), &again), IsOk());
  EXPECT_THAT(Floats(again.downloads(0).data()), ElementsAre(15, 18, 21, 24));
  grpc::ClientContext ctx;
  v1::ListSessionsResponse sessions;
  ASSERT_THAT(client_->sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &sessions), IsOk());
  ASSERT_EQ(sessions.sessions_size(), 1);
  const uint64_t neighbour = sessions.sessions(0).memory_bytes();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (MemoryInUse() != baseline + neighbour && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(MemoryInUse(), baseline + neighbour);
}

TEST_F(WatchdogTest, QueueWaitDoesNotCountAgainstTheLimit) {
  // Short evaluations queued one after another run well within the limit each, though together
  // they take longer than it.
  const std::string s = Open("short");
  MakePipeline(s, 1, 1024, 2.0f);
  const absl::Time start = absl::Now();
  int evals = 0;
  while (absl::Now() - start < kLimit + absl::Seconds(1)) {
    v1::EvalResponse resp;
    ASSERT_THAT(Eval(PipelineEval(s, 1, std::vector<float>(1024, 1.0f)), &resp), IsOk());
    ++evals;
  }
  EXPECT_GT(evals, 1);
  EXPECT_THAT(CreateTensor(FloatTensor(s, 100, {1})), IsOk());
}

// A device on which a stopped submission does not end within --kernel_stop_grace no longer
// answers: the daemon declares it lost and opens it again, and new sessions work there. (A GPU
// whose driver ended the runaway's context never completes the submission; here lavapipe's
// stopped runaway takes longer to end than the 1 ms grace given.)
class UnresponsiveDeviceTest : public WatchdogTest {
 protected:
  ServerOptions Options() override {
    ServerOptions options = WatchdogTest::Options();
    options.max_kernel_time = absl::Seconds(1);
    options.kernel_stop_grace = absl::Milliseconds(1);
    options.device_recovery_interval = absl::Milliseconds(200);
    return options;
  }

  bool Serving() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::health::v1::HealthCheckResponse resp;
    auto health = grpc::health::v1::Health::NewStub(client_->channel);
    return health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }
};

TEST_F(UnresponsiveDeviceTest, IsDeclaredLostAndOpenedAgain) {
  const std::string a = Open("runaway");
  ASSERT_THAT(CreateTensor(FloatTensor(a, 1, std::vector<float>(1024, 0.0f))), IsOk());
  std::string push(4, '\0');
  v1::CreateAlgorithmRequest algorithm = GlslAlgorithm(a, 2, {1}, kRunawayShader, 65535, push);
  algorithm.mutable_workgroup()->set_y(64);
  ASSERT_THAT(CreateAlgorithm(algorithm), IsOk());
  ASSERT_THAT(CreateSequence(a, 3), IsOk());
  ASSERT_THAT(Record(a, 3, {RecordOp(Dispatch(2))}), IsOk());
  ASSERT_TRUE(Serving());
  v1::EvalRequest req;
  req.set_session_id(a);
  req.set_sequence(3);
  v1::EvalResponse resp;
  const grpc::Status runaway = Eval(req, &resp);
  // Stopped by the watchdog; the device was declared lost while the stopped kernel ended.
  EXPECT_FALSE(runaway.ok());
  EXPECT_THAT(runaway.error_code(),
              ::testing::AnyOf(grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::UNAVAILABLE));
  // Opened again (after the 200 ms recovery interval): health serves, a new session works.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!Serving() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Serving());
  const std::string b = Open("after");
  MakePipeline(b, 10, 4, 2.0f);
  v1::EvalResponse out;
  ASSERT_THAT(Eval(PipelineEval(b, 10, {1, 2, 3, 4}), &out), IsOk());
  EXPECT_THAT(Floats(out.downloads(0).data()), ElementsAre(2, 4, 6, 8));
}

// The watchdog on its own, with made-up queues: what it stops, and when.
class WatchdogUnitTest : public ::testing::Test {
 protected:
  std::shared_ptr<Watchdog> watchdog_ =
      Watchdog::Create(absl::Milliseconds(5), [this](const std::string& session, absl::Duration) {
        absl::MutexLock lock(&mu_);
        stopped_.push_back(session);
      });
  absl::Mutex mu_;
  std::vector<std::string> stopped_ ABSL_GUARDED_BY(mu_);

  std::vector<std::string> Stopped() {
    absl::MutexLock lock(&mu_);
    return stopped_;
  }
  // Waits (bounded) until `n` submissions have been stopped.
  bool AwaitStopped(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopped_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  void TearDown() override { watchdog_->Stop(); }
};

// Two devices, told apart by their addresses.
const char kDeviceA = 'a', kDeviceB = 'b';

TEST_F(WatchdogUnitTest, ARunawayCostsItsNeighboursTheWaitNotTheirSessions) {
  // The runaway holds device A's compute units: the neighbour's submission on another queue of
  // A cannot run meanwhile and would pass its own limit.
  auto runaway =
      watchdog_->Started({&kDeviceA, 0}, "runaway", nullptr, absl::Milliseconds(20), /*order=*/1);
  ASSERT_TRUE(AwaitStopped(1));
  auto neighbour = watchdog_->Started({&kDeviceA, 1}, "neighbour", nullptr, absl::Milliseconds(300),
                                      /*order=*/1);
  // While the stopped runaway is still ending, the neighbour is not judged: 3 of its limits.
  absl::SleepFor(absl::Milliseconds(900));
  EXPECT_THAT(Stopped(), ElementsAre("runaway"));
  // The runaway has ended: the neighbour's time starts again, and it completes within it.
  runaway.reset();
  neighbour.reset();
  EXPECT_THAT(Stopped(), ElementsAre("runaway"));
}

TEST_F(WatchdogUnitTest, AfterTheRunawayHasEndedAStillRunningNeighbourGetsItsLimitAgain) {
  auto runaway =
      watchdog_->Started({&kDeviceA, 0}, "runaway", nullptr, absl::Milliseconds(20), /*order=*/1);
  ASSERT_TRUE(AwaitStopped(1));
  auto second =
      watchdog_->Started({&kDeviceA, 1}, "second", nullptr, absl::Milliseconds(20), /*order=*/1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_THAT(Stopped(), ElementsAre("runaway"));
  const absl::Time ended = absl::Now();
  runaway.reset();
  // A second runaway is stopped in its turn, no sooner than its limit after the first ended.
  ASSERT_TRUE(AwaitStopped(2));
  EXPECT_GE(absl::Now() - ended, absl::Milliseconds(20));
  EXPECT_THAT(Stopped(), ElementsAre("runaway", "second"));
}

TEST_F(WatchdogUnitTest, OtherDevicesAreJudgedWhileARunawayEnds) {
  auto runaway =
      watchdog_->Started({&kDeviceA, 0}, "runaway", nullptr, absl::Milliseconds(20), /*order=*/1);
  ASSERT_TRUE(AwaitStopped(1));
  auto other =
      watchdog_->Started({&kDeviceB, 0}, "other", nullptr, absl::Milliseconds(20), /*order=*/1);
  ASSERT_TRUE(AwaitStopped(2));
  EXPECT_THAT(Stopped(), ElementsAre("runaway", "other"));
}

TEST(WatchdogUnresponsive, AStoppedSubmissionThatDoesNotLeaveIsReportedOnce) {
  absl::Mutex mu;
  std::vector<std::pair<const void*, std::string>> reported;
  std::shared_ptr<Watchdog> watchdog = Watchdog::Create(
      absl::Milliseconds(5), [](const std::string&, absl::Duration) {}, absl::Milliseconds(100),
      [&](const void* device, const std::string& session, absl::Duration waited) {
        EXPECT_GE(waited, absl::Milliseconds(100));
        absl::MutexLock lock(&mu);
        reported.emplace_back(device, session);
      });
  auto runaway =
      watchdog->Started({&kDeviceA, 0}, "runaway", nullptr, absl::Milliseconds(20), /*order=*/1);
  auto ends =
      watchdog->Started({&kDeviceB, 0}, "ends", nullptr, absl::Milliseconds(20), /*order=*/1);
  absl::SleepFor(absl::Milliseconds(60));
  ends.reset();  // stopped, and left its device within the grace
  {
    absl::MutexLock lock(&mu);
    auto one = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return !reported.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(30)));
  }
  absl::SleepFor(absl::Milliseconds(300));
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(reported.size(), 1u);
    EXPECT_EQ(reported[0].first, &kDeviceA);
    EXPECT_EQ(reported[0].second, "runaway");
  }
  runaway.reset();
  watchdog->Stop();
}

TEST_F(WatchdogUnitTest, SubmissionsAreFollowedInTheQueuesOrderNotTheOrderTheyAreTold) {
  // Session a submits two at once (the queue's places 1 and 2); b's submission (3) is told
  // before a's second.
  auto a1 = watchdog_->Started({&kDeviceA, 0}, "a", nullptr, absl::Seconds(30), /*order=*/1);
  auto b3 = watchdog_->Started({&kDeviceA, 0}, "b", nullptr, absl::Milliseconds(30), /*order=*/3);
  auto a2 = watchdog_->Started({&kDeviceA, 0}, "a", nullptr, absl::Seconds(30), /*order=*/2);
  a1.reset();
  // a's second runs now, and b's waits behind it on the queue: b is not judged meanwhile.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_THAT(Stopped(), ::testing::IsEmpty());
  // Once a's second is done, b runs, and its limit counts from then.
  const absl::Time b_runs = absl::Now();
  a2.reset();
  ASSERT_TRUE(AwaitStopped(1));
  EXPECT_GE(absl::Now() - b_runs, absl::Milliseconds(30));
  EXPECT_THAT(Stopped(), ElementsAre("b"));
}

TEST_F(WatchdogUnitTest, OfTwoOverrunsOnOneDeviceTheFirstIsStopped) {
  auto late =
      watchdog_->Started({&kDeviceA, 1}, "late", nullptr, absl::Milliseconds(200), /*order=*/1);
  auto early =
      watchdog_->Started({&kDeviceA, 0}, "early", nullptr, absl::Milliseconds(20), /*order=*/1);
  ASSERT_TRUE(AwaitStopped(1));
  EXPECT_THAT(Stopped(), ElementsAre("early"));
}

}  // namespace
}  // namespace komputed::server::testing
