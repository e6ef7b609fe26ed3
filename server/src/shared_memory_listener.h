#pragma once
// The daemon's end of the same-host side channel (komputed/v1/shared_memory_wire.h): an abstract
// Unix socket and one thread that accepts its connections and answers their records. A connection
// either passes one shared-memory region and is closed, or binds itself to a session and carries
// that session's evals, one at a time. A connection that binds nothing within a short time is
// closed; so are connections beyond a fixed number at once. The thread never waits on the device:
// taking a region is a few system calls, and an eval is handed on once submitted, its answer sent
// from whichever thread completes it.

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "komputed/v1/shared_memory_wire.h"

namespace komputed::server {

class SharedMemoryListener {
 public:
  struct Handlers {
    // Takes a request's region (its descriptor is the callee's, open or closed, once called) and
    // says how it went; the client receives the status.
    std::function<absl::Status(v1::wire::SharedMemoryAttach request)> take;
    // Whether `ticket` is an open session's: a channel binds to it.
    std::function<absl::Status(absl::string_view ticket)> bind;
    // Runs the serialized EvalRequest `request` in the session of `ticket`, and calls `answer`
    // once, from any thread, with the answer record (v1::wire::EncodeChannelReply). Called on
    // one of the listener's eval workers, which may wait for the device a bounded time.
    std::function<void(const std::string& ticket, std::string request,
                       std::function<void(std::string record)> answer)>
        eval;
  };
  // Listens on a new abstract name (komputed-<pid>-<random>), with `eval_workers` threads (at
  // least 1) that run the channels' evals.
  static absl::StatusOr<std::unique_ptr<SharedMemoryListener>> Start(Handlers handlers,
                                                                     size_t eval_workers);
  // Stops the thread and closes every connection (answers still to come are dropped).
  ~SharedMemoryListener();
  SharedMemoryListener(const SharedMemoryListener&) = delete;
  SharedMemoryListener& operator=(const SharedMemoryListener&) = delete;

  // The abstract name, without its leading NUL (OpenSessionResponse.shared_memory_socket).
  const std::string& name() const { return name_; }

 private:
  struct Connection;
  SharedMemoryListener() = default;
  void Run();
  // Handles one record of `c`; false when the connection is to be closed.
  bool Handle(const std::shared_ptr<Connection>& c, v1::wire::ReceivedRecord received);

  std::string name_;
  Handlers handlers_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that the destructor signals
  std::thread thread_;
  // The eval workers and their queue (at most one eval per bound connection).
  void Work();
  absl::Mutex jobs_mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool stopping_ ABSL_GUARDED_BY(jobs_mu_) = false;
  std::vector<std::thread> workers_;
};

// A new random ticket (v1::wire::kSharedMemoryTicketSize hex characters).
std::string NewSharedMemoryTicket();

}  // namespace komputed::server
