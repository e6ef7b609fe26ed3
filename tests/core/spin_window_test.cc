// SpinWindow: how long a wait for one submission polls, from what the ones before it took.

#include <gtest/gtest.h>

#include "komputed/core/spin.h"

namespace komputed::core {
namespace {

constexpr absl::Duration kBase = absl::Microseconds(50);
constexpr absl::Duration kLimit = absl::Microseconds(500);
const absl::Time kSubmitted = absl::FromUnixSeconds(1000);

absl::Duration Us(int64_t us) { return absl::Microseconds(us); }

TEST(SpinWindow, PollsTheBaseUntilASubmissionHasBeenSeen) {
  SpinWindow spin(kBase, kLimit);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), kBase);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted + Us(30)), kBase);
}

TEST(SpinWindow, OneCaughtBySleepingWidensTheWindowForTheNext) {
  SpinWindow spin(kBase, kLimit);
  // The device took 150 us; the wait polled 50, slept, and woke 120 us late.
  spin.Observe(Us(270), /*seen_running=*/true);
  // The next one is polled for 1.5 times that from its submission, within the limit.
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), Us(405));
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted + Us(5)), Us(400));
  // Caught by the polling after 150 us: the window follows it down.
  spin.Observe(Us(150), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), Us(225));
}

TEST(SpinWindow, NeverPollsPastTheLimitNorLessThanTheBase) {
  SpinWindow spin(kBase, kLimit);
  spin.Observe(Us(400), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), kLimit);  // not 600
  // A wait that starts late still polls the base.
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted + Us(490)), kBase);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted + absl::Seconds(1)), kBase);
  spin.Observe(Us(10), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), kBase);  // 15 us is less than the base
}

TEST(SpinWindow, LongSubmissionsArePolledOnlyTheBase) {
  SpinWindow spin(kBase, kLimit);
  spin.Observe(absl::Milliseconds(5), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), kBase);
  // Once they are short again, the window follows.
  spin.Observe(Us(100), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), Us(150));
}

TEST(SpinWindow, OneCompleteAtTheFirstLookOnlyBoundsWhatItTook) {
  SpinWindow spin(kBase, kLimit);
  spin.Observe(Us(200), /*seen_running=*/true);
  // Waited for late (after 2 ms): it took at most that, which says nothing new.
  spin.Observe(absl::Milliseconds(2), /*seen_running=*/false);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), Us(300));
  // Waited for after 60 us and complete: it took at most 60.
  spin.Observe(Us(60), /*seen_running=*/false);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), Us(90));
}

TEST(SpinWindow, ABaseOfZeroNeverPolls) {
  SpinWindow spin(absl::ZeroDuration(), kLimit);
  spin.Observe(Us(100), /*seen_running=*/true);
  EXPECT_EQ(spin.Window(kSubmitted, kSubmitted), absl::ZeroDuration());
}

}  // namespace
}  // namespace komputed::core
