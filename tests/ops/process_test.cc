// The programs that tests and benchmarks start (test_support::Spawn) end with the process that
// started them, however it ends: a daemon never outlives a killed test or benchmark.
#include "support/process.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace komputed::ops_testing {
namespace {

namespace ts = komputed::test_support;

constexpr char kHelperEnv[] = "KOMPUTED_TEST_SPAWN_HELPER";
constexpr char kChildLine[] = "spawned ";

// Whether `pid` has ended (gone, or a zombie that nobody has reaped).
bool Ended(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close == std::string::npos || line.size() < close + 3 || line[close + 2] == 'Z';
}

// Run by the test below in a process of its own: starts a long sleep from a thread that then ends
// (as a benchmark starts its daemons), prints the sleep's pid, and waits to be killed.
TEST(SpawnHelper, StartsAChildAndWaits) {
  if (std::getenv(kHelperEnv) == nullptr) GTEST_SKIP() << "run by SpawnTest only";
  pid_t child = -1;
  std::thread([&] {
    int out = -1;
    child = ts::Spawn({"/bin/sleep", "120"}, &out);
    if (out >= 0) close(out);
  }).join();
  ASSERT_GT(child, 0);
  std::printf("%s%d\n", kChildLine, static_cast<int>(child));
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(120));
}

TEST(SpawnTest, AChildEndsWhenTheProcessThatStartedItIsKilled) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  setenv(kHelperEnv, "1", 1);
  int out = -1;
  const pid_t helper = ts::Spawn({self, "--gtest_filter=SpawnHelper.*"}, &out);
  unsetenv(kHelperEnv);
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
