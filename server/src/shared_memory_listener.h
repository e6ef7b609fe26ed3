#pragma once
// The daemon's end of the same-host side channel (komputed/v1/shared_memory_wire.h): an abstract
// Unix socket and one thread that accepts its connections and answers each one's request. A
// connection that sends nothing valid within a short time is closed; so are connections beyond a
// fixed number at once. The thread never waits on the device or on a session's lock held across
// device work: taking a region is a few system calls.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "komputed/v1/shared_memory_wire.h"

namespace komputed::server {

class SharedMemoryListener {
 public:
  // Takes a request's region (its descriptor is the callee's, open or closed, once called) and
  // says how it went; the client receives the status.
  using Take = std::function<absl::Status(v1::wire::SharedMemoryAttach request)>;
  // Listens on a new abstract name (komputed-<pid>-<random>).
  static absl::StatusOr<std::unique_ptr<SharedMemoryListener>> Start(Take take);
  // Stops the thread and closes every connection.
  ~SharedMemoryListener();
  SharedMemoryListener(const SharedMemoryListener&) = delete;
  SharedMemoryListener& operator=(const SharedMemoryListener&) = delete;

  // The abstract name, without its leading NUL (OpenSessionResponse.shared_memory_socket).
  const std::string& name() const { return name_; }

 private:
  SharedMemoryListener() = default;
  void Run();

  std::string name_;
  Take take_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that the destructor signals
  std::thread thread_;
};

// A new random ticket (v1::wire::kSharedMemoryTicketSize hex characters).
std::string NewSharedMemoryTicket();

}  // namespace komputed::server
