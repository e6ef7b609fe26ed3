#pragma once
// Memory that two processes on one host both map: a memfd, sealed so that neither can shrink or
// grow it under the other (a mapping never loses its pages, so reading it cannot fault). Same-host
// clients keep their tensors' host data in one and pass it to the daemon, which makes the tensor's
// host-data buffer over it (Buffer::Import): a sync then moves no byte through a socket.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "komputed/core/tensor.h"

namespace komputed::core {

class SharedMemory {
 public:
  // A new zero-filled region of at least `size` bytes (whole pages), mapped and sealed, its file
  // descriptor kept for passing on. `name` shows in /proc/<pid>/maps. INVALID_ARGUMENT for 0;
  // RESOURCE_EXHAUSTED when the system has no memory for it; UNIMPLEMENTED without memfds.
  static absl::StatusOr<std::shared_ptr<SharedMemory>> Create(uint64_t size,
                                                              absl::string_view name);
  // Maps the region another process made and passed as `fd`, after checking that it is a memfd
  // of exactly `size` bytes (whole pages, at most `max_size`) that is sealed against shrinking and
  // growing and can be written. The mapping is all that is kept; else INVALID_ARGUMENT naming what
  // is wrong. `fd` stays the caller's either way (it may be any file, whose close may wait on its
  // file system: v1::wire::PassedFd).
  static absl::StatusOr<std::shared_ptr<SharedMemory>> Adopt(int fd, uint64_t size,
                                                             uint64_t max_size);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The descriptor (Create, until CloseDescriptor), or -1 (Adopt).
  int fd() const { return fd_; }
  // Closes the descriptor once passed on: the mapping is all that stays.
  void CloseDescriptor();

  // The memory as a tensor's host memory (Tensor::Create), holding `self` (this object).
  static HostMemory AsHostMemory(const std::shared_ptr<SharedMemory>& self) {
    return HostMemory{self->data_, self->size_, self};
  }

  // The system's page size: the unit of every region.
  static uint64_t PageSize();

 private:
  SharedMemory() = default;

  void* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
};

}  // namespace komputed::core
