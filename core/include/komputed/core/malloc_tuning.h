#pragma once

namespace komputed::core {

// Tunes glibc malloc for moving tensor data in multi-megabyte messages: without it, each
// message's buffers are fresh mmap()ed (or freshly trimmed) pages, and the page faults on
// first touch cost more than the copies (a 4 MiB chunk is 1024 faults). Raises the mmap
// threshold to 32 MiB and the trim threshold to 128 MiB, so that freed chunk buffers are
// reused. Process-wide and applied once; skipped when KOMPUTED_MALLOC_TUNING=0 or when
// GLIBC_TUNABLES is set (the user tunes malloc). Returns whether it was applied.
bool TuneMallocForBulkTransfers();

// Gives the whole free pages inside malloc's heaps back to the kernel (glibc's malloc_trim): for
// after many objects were freed at once, whose memory the raised trim threshold would otherwise
// keep resident for later allocations. Takes each heap's lock while it walks it (milliseconds
// for a large heap): call it from housekeeping, not per request. Returns whether any memory went.
bool GiveFreePagesBack();

}  // namespace komputed::core
