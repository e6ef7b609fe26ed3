#include "komputed/core/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace komputed::core {

namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

std::string Errno(int error) { return std::strerror(error); }

}  // namespace

uint64_t SharedMemory::PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<std::shared_ptr<SharedMemory>> SharedMemory::Create(uint64_t size,
                                                                   absl::string_view name) {
  if (size == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  const uint64_t page = PageSize();
  if (size > UINT64_MAX - page) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory of ", size, " bytes"));
  }
  const uint64_t rounded = (size + page - 1) / page * page;
  auto memory = std::shared_ptr<SharedMemory>(new SharedMemory());
  memory->fd_ = memfd_create(std::string(name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memory->fd_ < 0) {
    const int error = errno;
    return absl::UnimplementedError(absl::StrCat("memfd_create: ", Errno(error)));
  }
  if (ftruncate(memory->fd_, static_cast<off_t>(rounded)) != 0) {
    const int error = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory of ", rounded, " bytes: ftruncate: ", Errno(error)));
  }
  if (fcntl(memory->fd_, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    const int error = errno;
    return absl::UnimplementedError(absl::StrCat("sealing shared memory: ", Errno(error)));
  }
  // Populated now, as a driver's host-visible allocation is: otherwise the first write to each
  // page (the tensor's first sync) pays a fault, which on a virtual machine costs microseconds.
  void* data =
      mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memory->fd_, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping shared memory of ", rounded, " bytes: ", Errno(error)));
  }
  memory->data_ = data;
  memory->size_ = rounded;
  return memory;
}

absl::StatusOr<std::shared_ptr<SharedMemory>> SharedMemory::Adopt(int fd, uint64_t size,
                                                                  uint64_t max_size) {
  const uint64_t page = PageSize();
  if (size == 0 || size % page != 0 || size > max_size) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory of ", size,
                                                   " bytes: not a whole number of ", page,
                                                   "-byte pages from 1 to ", max_size / page));
  }
  // The seals first: F_GET_SEALS answers at once for any descriptor, and fails for all but memfds
  // (and shmem files), where fstat of a file on a client's own FUSE mount would ask the client.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "the descriptor passed as shared memory is not a memfd that allows sealing");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the descriptor passed as shared memory is not a memfd");
  }
  if ((seals & kSizeSeals) != kSizeSeals) {
    return absl::InvalidArgumentError(
        "the memfd passed as shared memory is not sealed against shrinking and growing "
        "(F_SEAL_SHRINK | F_SEAL_GROW)");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError("the memfd passed as shared memory is sealed against writes");
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the memfd passed as shared memory holds ", st.st_size, " bytes, not ", size));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    return absl::InvalidArgumentError(
        absl::StrCat("mapping the shared memory of ", size, " bytes: ", Errno(error)));
  }
  auto memory = std::shared_ptr<SharedMemory>(new SharedMemory());
  memory->data_ = data;
  memory->size_ = size;
  return memory;
}

void SharedMemory::CloseDescriptor() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

SharedMemory::~SharedMemory() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace komputed::core
