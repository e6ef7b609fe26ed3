// A session's parallel transfer connections and the daemon's advertised direct address: they
// reach the daemon that holds the session, and where they cannot (another daemon behind a
// balancer, an address that does not answer), the transfer keeps to the session's connection,
// whole and exact.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kp_test.h"
#include "support/daemon_process.h"
#include "support/process.h"
#include "support/scoped_env.h"

namespace kptest {
namespace {

using komputed::test_support::DaemonProcess;
using komputed::test_support::ScopedEnv;

// 64 MiB through 4 transfer lanes each way: up into `a`, copied on the device, down from `b`.
void RoundTripInLanes(const std::string& address) {
  ScopedEnv lanes("KOMPUTED_TRANSFER_STREAMS", "4");
  kp::Manager mgr(kp::Remote{address, 0, {}});
  constexpr size_t kCount = size_t{16} << 20;
  std::vector<float> data(kCount);
  for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(i % 100003) * 0.5f;
  auto a = mgr.tensor(data);
  auto b = mgr.tensor(std::vector<float>(kCount, -1.0f));
  const auto start = std::chrono::steady_clock::now();
  mgr.sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{a})
      ->record<kp::OpTensorCopy>(TensorList{a, b})
      ->record<kp::OpTensorSyncLocal>(TensorList{b})
      ->eval();
  std::printf("64 MiB up and down in lanes took %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  const std::vector<float> got = b->vector();
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += got[i] != data[i];
  EXPECT_EQ(wrong, 0u);
}

TEST(DirectAddress, LanesToTheAdvertisedAddressReachTheSession) {
  // The daemon advertises its own address, as the manifests do with the pod's IP.
  const int port = komputed::test_support::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  DaemonProcess daemon({"--listen=" + address, "--advertise_address=" + address});
  ASSERT_TRUE(daemon.started());
  RoundTripInLanes(daemon.address());
}

TEST(DirectAddress, LanesThatReachAnotherDaemonFallBackToTheSessionsConnection) {
  // The session's daemon advertises another daemon's address (as a balancer would spread the
  // lanes): that daemon does not know the session and says so; the data still arrives whole.
  DaemonProcess other;
  ASSERT_TRUE(other.started());
  DaemonProcess daemon({"--advertise_address=" + other.address()});
  ASSERT_TRUE(daemon.started());
  RoundTripInLanes(daemon.address());
}

TEST(DirectAddress, AnAddressThatDoesNotAnswerFallsBackToTheSessionsConnection) {
  DaemonProcess daemon({"--advertise_address=127.0.0.1:1"});
  ASSERT_TRUE(daemon.started());
  RoundTripInLanes(daemon.address());
}

}  // namespace
}  // namespace kptest
