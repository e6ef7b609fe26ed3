// The programs that tests and benchmarks start (test_support::Spawn) end with the process that
// started them, however it ends: a daemon never outlives a killed test or benchmark.
#include "support/process.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace komputed::ops_testing {
namespace {

namespace ts = komputed::test_support;

constexpr char kChildLine[] = "spawned ";

// Whether `pid` has ended (gone, or a zombie that nobody has reaped).
bool Ended(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close == std::string::npos || line.size() < close + 3 || line[close + 2] == 'Z';
}

TEST(SpawnTest, AChildEndsWhenTheProcessThatStartedItIsKilled) {
  // SPAWN_HELPER starts a sleep from a thread that then ends, prints its pid, and waits.
  int out = -1;
  const pid_t helper = ts::Spawn({SPAWN_HELPER}, &out);
  ASSERT_GT(helper, 0);
  pid_t child = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (child <= 0 && absl::Now() < deadline) {
    const std::string line = ts::ReadLine(out, deadline);
    if (line.rfind(kChildLine, 0) != 0) continue;
    int pid = 0;
    if (absl::SimpleAtoi(line.substr(sizeof(kChildLine) - 1), &pid)) child = pid;
  }
  close(out);
  ASSERT_GT(child, 0) << "the helper did not start its child";
  EXPECT_FALSE(Ended(child)) << "the child ended before its parent was killed";
  kill(helper, SIGKILL);
  EXPECT_NE(ts::WaitExit(helper, absl::Seconds(30)), -1);
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!Ended(child) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  const bool ended = Ended(child);
  if (!ended) kill(child, SIGKILL);
  EXPECT_TRUE(ended) << "the child outlived the process that started it";
}

}  // namespace
}  // namespace komputed::ops_testing
