// Tests of the malloc tuning: memory freed inside the heap stays resident under the bulk-transfer
// tuning until GiveFreePagesBack returns it to the kernel.

#include "komputed/core/malloc_tuning.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "support/sanitizers.h"

namespace komputed::core {
namespace {

// This process's anonymous resident memory, in KiB (/proc/self/status RssAnon).
long RssAnonKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    long kib = 0;
    if (std::sscanf(line.c_str(), "RssAnon: %ld kB", &kib) == 1) return kib;
  }
  return -1;
}

TEST(MallocTuning, FreedPagesGoBackToTheKernelWhenAsked) {
  if (test_support::kAddressSanitizer || test_support::kThreadSanitizer) {
    GTEST_SKIP() << "a sanitizer's allocator replaces glibc malloc";
  }
  if (!TuneMallocForBulkTransfers()) {
    GTEST_SKIP() << "the tuning is turned off (KOMPUTED_MALLOC_TUNING=0 or GLIBC_TUNABLES)";
  }
  ASSERT_GT(RssAnonKiB(), 0);
  // 64 MiB in blocks far below the mmap threshold, so in the heap; one block after them keeps the
  // heap's top from being what is freed.
  constexpr size_t kBlock = 4000;
  constexpr size_t kBlocks = (64u << 20) / kBlock;
  std::vector<char*> blocks;
  blocks.reserve(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    blocks.push_back(new char[kBlock]);
    std::memset(blocks.back(), 1, kBlock);
  }
  char* keep = new char[kBlock];
  std::memset(keep, 1, kBlock);
  const long full = RssAnonKiB();
  for (char* b : blocks) delete[] b;
  blocks.clear();
  blocks.shrink_to_fit();
  const long freed = RssAnonKiB();
  // The raised trim threshold keeps the freed memory resident (for the next allocations).
  EXPECT_GT(freed, full - 16 * 1024) << "full " << full << " KiB, after the frees " << freed;
  EXPECT_TRUE(GiveFreePagesBack());
  const long given_back = RssAnonKiB();
  EXPECT_LT(given_back, freed - 48 * 1024)
      << "after the frees " << freed << " KiB, after GiveFreePagesBack " << given_back;
  delete[] keep;
}

}  // namespace
}  // namespace komputed::core
