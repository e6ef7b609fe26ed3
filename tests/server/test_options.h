#pragma once
// The options of the daemons that the server tests start in process.

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/time/time.h"
#include "server.h"

namespace komputed::server::testing {

// Options for a test's daemon: 127.0.0.1:0, and the kernel watchdog's limit that the suite's
// runner gives (KOMPUTED_TEST_MAX_KERNEL_TIME: `make test` keeps ordinary kernels of a loaded
// 2-core lavapipe machine clear of it, the sanitizer suites raise it further, as their lavapipe
// runs shaders tens of times slower).
inline ServerOptions TestServerOptions() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  if (const char* limit = std::getenv("KOMPUTED_TEST_MAX_KERNEL_TIME"); limit != nullptr) {
    EXPECT_TRUE(absl::ParseDuration(limit, &options.max_kernel_time))
        << "KOMPUTED_TEST_MAX_KERNEL_TIME=" << limit;
  }
  return options;
}

}  // namespace komputed::server::testing
