// What a kp program sees when komputed's kernel watchdog stops its kernel: an error that says so,
// never a wait that merely timed out.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "kp_test.h"
#include "support/daemon_process.h"
#include "support/slow_kernel.h"

namespace kptest {
namespace {

using ::testing::HasSubstr;

TEST(RemoteWatchdog, AStoppedKernelIsAnErrorNotATimedOutWait) {
  komputed::test_support::DaemonProcess daemon({"--max_kernel_time=1s"});
  ASSERT_TRUE(daemon.started());
  kp::Manager mgr(kp::Remote{daemon.address(), 0, {}});
  auto out = mgr.tensorT<float>(std::vector<float>(64, 0.0f));
  auto algo = mgr.algorithm<float, uint32_t>(
      {out}, kp::compileSource(komputed::test_support::kRunawayShader), kp::Workgroup{65535, 64, 1},
      {}, {0u});
  auto seq = mgr.sequence();
  seq->record<kp::OpAlgoDispatch>(algo);
  seq->evalAsync();

  // Short awaits return while the kernel runs (Kompute's timed-out evalAwait); once the watchdog
  // has stopped it, the await throws. Bounded: a loaded or sanitized lavapipe takes up to a
  // minute to wind the dispatch down.
  const auto start = std::chrono::steady_clock::now();
  int timed_out = 0;
  std::string error;
  kp::ErrorCode code = kp::ErrorCode::kInternal;
  bool completed = false;
  while (std::chrono::steady_clock::now() - start < std::chrono::minutes(5)) {
    try {
      if (seq->evalAwaitFor(200'000'000)) {
        completed = true;
        break;
      }
      ++timed_out;
    } catch (const kp::Error& e) {
      code = e.code();
      error = e.what();
      break;
    }
  }
  EXPECT_FALSE(completed) << "the runaway completed instead of being stopped";
  EXPECT_GT(timed_out, 0) << "no await returned while the kernel ran";
  EXPECT_EQ(code, kp::ErrorCode::kDeadlineExceeded) << error;
  EXPECT_THAT(error, HasSubstr("watchdog"));
  EXPECT_THAT(error, HasSubstr("1s"));
  EXPECT_FALSE(seq->isRunning());
  // The session is closed, and the next call says why.
  try {
    mgr.tensor({1.0f});
    ADD_FAILURE() << "a closed session created a tensor";
  } catch (const kp::Error& e) {
    EXPECT_EQ(e.code(), kp::ErrorCode::kFailedPrecondition) << e.what();
    EXPECT_THAT(std::string(e.what()), HasSubstr("max_kernel_time"));
  }
}

}  // namespace
}  // namespace kptest
