// Two daemons behind an L4 round-robin balancer (haproxy in TCP mode, which spreads connections as
// kube-proxy does): every session's traffic, its parallel transfer connections included, reaches
// the daemon that holds the session; with the daemons' direct addresses advertised, and without.
//
// Environment: HAPROXY, the balancer's binary (default /usr/sbin/haproxy, from scripts/setup).
#include "support/balancer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <kompute/Kompute.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "support/process.h"
#include "support/scoped_env.h"
#include "support/stubs.h"

namespace komputed {
namespace {

using test_support::Haproxy;
using test_support::ScopedEnv;
using test_support::Stubs;
using ::testing::HasSubstr;
using TensorList = std::vector<std::shared_ptr<kp::Tensor>>;

std::string ExampleProgram() {
  const char* value = std::getenv("ARRAY_MULTIPLICATION");
  return value != nullptr && value[0] != '\0' ? value : ARRAY_MULTIPLICATION;
}

// Two daemons on fixed ports (advertising them when `advertise`), and haproxy in front.
class Balanced : public test_support::BalancedDaemons {
 public:
  explicit Balanced(bool advertise) : BalancedDaemons(2, advertise) {}
  // Sessions open on daemon `i` now (asked directly, not through the balancer).
  int Sessions(size_t i) const {
    Stubs stubs(daemon_address(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListSessionsResponse resp;
    const grpc::Status s = stubs.sessions->ListSessions(&ctx, v1::ListSessionsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.sessions_size();
  }
};

// `mib` MiB up into a tensor, copied on the device, and down from another, in 4 transfer lanes:
// "" when every byte came back, else what went wrong.
std::string RoundTrip(kp::Manager& mgr, size_t mib) {
  const size_t count = mib << 18;
  std::vector<float> data(count);
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 1000003);
  auto a = mgr.tensor(data);
  auto b = mgr.tensor(std::vector<float>(count, -1.0f));
  mgr.sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{a})
      ->record<kp::OpTensorCopy>(TensorList{a, b})
      ->record<kp::OpTensorSyncLocal>(TensorList{b})
      ->eval();
  const float* got = b->data();
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += got[i] != data[i];
  return wrong == 0 ? "" : absl::StrCat(wrong, " of ", count, " elements wrong");
}

constexpr char kTimes[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0) buffer In { float x[]; };
  layout(set = 0, binding = 1) buffer Out { float y[]; };
  layout(push_constant) uniform P { float k; };
  void main() { uint i = gl_GlobalInvocationID.x; y[i] = x[i] * k; }
)";

// The balancer in front of both daemons, each test with its own pair.
class BalancerTest : public ::testing::TestWithParam<bool> {};

TEST_P(BalancerTest, LargeTransfersInFourLanesReachTheSessionsDaemon) {
  Balanced b(/*advertise=*/GetParam());
  ASSERT_TRUE(b.ready()) << "the daemons or " << Haproxy() << " did not start";
  ScopedEnv lanes("KOMPUTED_TRANSFER_STREAMS", "4");
  // Sessions opened one after another land on both daemons (round robin by connection).
  std::vector<std::unique_ptr<kp::Manager>> managers;
  for (int i = 0; i < 4; ++i) {
    managers.push_back(std::make_unique<kp::Manager>(kp::Remote{b.address(), 0, {}}));
  }
  EXPECT_GT(b.Sessions(0), 0);
  EXPECT_GT(b.Sessions(1), 0);
  // 256 MiB once, and 32 MiB on each session.
  const absl::Time start = absl::Now();
  EXPECT_EQ(RoundTrip(*managers[0], 256), "");
  std::printf("256 MiB up and down through the balancer: %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  for (size_t i = 0; i < managers.size(); ++i) EXPECT_EQ(RoundTrip(*managers[i], 32), "");
}

TEST_P(BalancerTest, SixteenClientsEvaluateAsynchronouslyAtOnce) {
  Balanced b(/*advertise=*/GetParam());
  ASSERT_TRUE(b.ready()) << "the daemons or " << Haproxy() << " did not start";
  constexpr int kClients = 16;
  constexpr uint32_t kCount = 4096;
  std::vector<std::string> failures(kClients);
  std::atomic<int> opened{0};
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<kp::Manager>> managers(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        managers[c] = std::make_unique<kp::Manager>(kp::Remote{b.address(), 0, {}});
        kp::Manager& mgr = *managers[c];
        ++opened;
        std::vector<float> x(kCount);
        for (uint32_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(i + c);
        auto in = mgr.tensor(x);
        auto out = mgr.tensor(std::vector<float>(kCount, 0.0f));
        auto algo = mgr.algorithm(TensorList{in, out}, kp::compileSource(kTimes),
                                  kp::Workgroup{kCount / 64, 1, 1}, std::vector<float>{},
                                  std::vector<float>{1.0f});
        mgr.sequence()->eval<kp::OpTensorSyncDevice>(TensorList{in});
        auto seq = mgr.sequence();
        for (int round = 1; round <= 10; ++round) {
          const float k = static_cast<float>(round);
          seq->record<kp::OpAlgoDispatch>(algo, std::vector<float>{k})
              ->record<kp::OpTensorSyncLocal>(TensorList{out})
              ->evalAsync();
          seq->evalAwait();
          const float* y = out->data();
          for (uint32_t i = 0; i < kCount; ++i) {
            if (y[i] != x[i] * k) {
              failures[c] = absl::StrCat("round ", round, " element ", i, ": ", y[i]);
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        failures[c] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], "") << "client " << c;
  EXPECT_EQ(opened.load(), kClients);
  // Both daemons served some of them.
  EXPECT_GT(b.Sessions(0), 0);
  EXPECT_GT(b.Sessions(1), 0);
}

TEST_P(BalancerTest, TheExampleRunsThroughTheBalancer) {
  Balanced b(/*advertise=*/GetParam());
  ASSERT_TRUE(b.ready()) << "the daemons or " << Haproxy() << " did not start";
  for (int run = 0; run < 4; ++run) {  // both daemons, twice each
    std::string out, err;
    const int rc = test_support::RunProgram(
        {"/usr/bin/env", "KOMPUTED_ADDRESS=" + b.address(), ExampleProgram()}, &out, &err,
        absl::Seconds(120));
    EXPECT_EQ(rc, 0) << out << err;
    EXPECT_THAT(out, HasSubstr("out_a: 4 8 12"));
    EXPECT_THAT(out, HasSubstr("out_b: 10 10 10"));
  }
}

INSTANTIATE_TEST_SUITE_P(Advertised, BalancerTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DirectAddresses" : "NoDirectAddresses";
                         });

}  // namespace
}  // namespace komputed
