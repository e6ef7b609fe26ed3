#include "komputed/core/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace komputed::core {

bool TuneMallocForBulkTransfers() {
  static const bool applied = [] {
    const char* setting = std::getenv("KOMPUTED_MALLOC_TUNING");
    if (setting != nullptr && std::strcmp(setting, "0") == 0) return false;
    if (std::getenv("GLIBC_TUNABLES") != nullptr) return false;
    const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
    const bool trim_set = mallopt(M_TRIM_THRESHOLD, 128 << 20) == 1;
    return mmap_set && trim_set;
  }();
  return applied;
}

bool GiveFreePagesBack() { return malloc_trim(0) == 1; }

}  // namespace komputed::core
