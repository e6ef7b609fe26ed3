#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace komputed::server {

// A few threads for the slow CPU work of requests — compiling GLSL, building pipelines, filling
// the memory of large new tensors — so that gRPC's serving threads never wait on it: a handler
// hands its work here and finishes its call from the job. At most `max_queued` jobs wait; more are
// refused. Thread-safe.
class BuildPool {
 public:
  BuildPool(int threads, size_t max_queued);
  // Runs every job already queued, then stops the threads.
  ~BuildPool();
  BuildPool(const BuildPool&) = delete;
  BuildPool& operator=(const BuildPool&) = delete;

  // Queues `job`; RESOURCE_EXHAUSTED (and `job` not run) when max_queued jobs wait already.
  absl::Status Run(std::function<void()> job);

 private:
  void Work();

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace komputed::server
