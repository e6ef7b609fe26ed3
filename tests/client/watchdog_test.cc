// What a kp program sees when komputed's kernel watchdog stops its kernel: an error that says so,
// never a wait that merely timed out.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "kp_test.h"
#include "support/daemon_process.h"

namespace kptest {
namespace {

using ::testing::HasSubstr;

// Each invocation loops for ever on a GPU (lavapipe ends loops after about 65535 iterations:
// there the work is in the 65535 x 64 workgroups of 64 invocations, hours of it).
constexpr char kRunaway[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0) buffer Out { float result[]; };
  layout(push_constant) uniform Params { uint iterations; } params;
  void main() {
    float acc = float(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y);
    for (uint k = 0; params.iterations == 0u || k < params.iterations; ++k) acc = acc * 0.999 + 1.0;
    if (acc == -12345.0) result[0] = acc;
  }
)";

TEST(RemoteWatchdog, AStoppedKernelIsAnErrorNotATimedOutWait) {
  komputed::test_support::DaemonProcess daemon({"--max_kernel_time=1s"});
  ASSERT_TRUE(daemon.started());
  kp::Manager mgr(kp::Remote{daemon.address(), 0, {}});
  auto out = mgr.tensorT<float>(std::vector<float>(64, 0.0f));
  auto algo = mgr.algorithm<float, uint32_t>({out}, kp::compileSource(kRunaway),
                                             kp::Workgroup{65535, 64, 1}, {}, {0u});
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
