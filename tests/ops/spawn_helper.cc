// The middle process of SpawnTest (process_test.cc): starts a long sleep from a thread that then
// ends (as a benchmark starts its daemons), prints "spawned <pid>" and waits to be killed.
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "support/process.h"

int main() {
  pid_t child = -1;
  std::thread([&] {
    int out = -1;
    child = komputed::test_support::Spawn({"/bin/sleep", "120"}, &out);
    if (out >= 0) close(out);
  }).join();
  if (child <= 0) {
    std::fprintf(stderr, "spawn_helper: could not start /bin/sleep\n");
    return 1;
  }
  std::printf("spawned %d\n", static_cast<int>(child));
  std::fflush(stdout);
  sleep(120);
  return 0;
}
