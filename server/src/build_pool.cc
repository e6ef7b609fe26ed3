#include "build_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "komputed/core/thread_name.h"

namespace komputed::server {

BuildPool::BuildPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] {
      core::NameThisThread("kd-build");
      Work();
    });
  }
}

BuildPool::~BuildPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status BuildPool::Run(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (jobs_.size() >= max_queued_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon has ", jobs_.size(),
                     " builds (shaders, large tensors) waiting already; try again when they are "
                     "done"));
  }
  jobs_.push_back(std::move(job));
  return absl::OkStatus();
}

void BuildPool::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](BuildPool* p)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stopping_ || !p->jobs_.empty(); },
        this));
    if (jobs_.empty()) return;  // stopping, and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    mu_.Unlock();
    job();
    job = nullptr;  // what it holds goes before the lock is taken again
    mu_.Lock();
  }
}

}  // namespace komputed::server
