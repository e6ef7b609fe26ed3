#pragma once
// A FUSE file system served from this process (by hand, over /dev/fuse) with one regular file,
// "file", whose closes can be made to wait: while Stall() holds, every FUSE_FLUSH (what close()
// of a descriptor of the file asks) stays unanswered, so any process that closes a descriptor of
// it waits in close(). What a hostile same-host client can pass the daemon in place of a memfd.

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace komputed::test_support {

class StallingFuse {
 public:
  // Mounts it on a new folder under /tmp and starts serving; mounted() says whether that worked
  // (it needs /dev/fuse and the right to mount), error() why not.
  StallingFuse();
  // Answers what is held, unmounts, and ends the connection (closes still waiting fail).
  ~StallingFuse();
  StallingFuse(const StallingFuse&) = delete;
  StallingFuse& operator=(const StallingFuse&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  // The file's path.
  std::string file() const { return dir_ + "/file"; }

  // From now on, FUSE_FLUSH requests are held unanswered.
  void Stall();
  // Answers the held ones, and every later one at once.
  void Release();
  // FUSE_FLUSH requests seen so far.
  int flushes() const { return flushes_.load(); }

 private:
  void Serve();
  void Reply(uint64_t unique, int error, const void* payload, size_t size);

  std::string dir_;
  std::string error_;
  bool mounted_ = false;
  int fuse_fd_ = -1;
  int stop_fd_ = -1;
  std::atomic<int> flushes_{0};
  absl::Mutex mu_;
  bool stall_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> held_ ABSL_GUARDED_BY(mu_);
  std::thread server_;
};

}  // namespace komputed::test_support
