#include "support/stalling_fuse.h"

#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace komputed::test_support {

namespace {

constexpr uint64_t kRoot = FUSE_ROOT_ID;
constexpr uint64_t kFile = 2;
constexpr uint32_t kMaxWrite = 128 << 10;

fuse_attr Attributes(uint64_t node) {
  fuse_attr attr{};
  attr.ino = node;
  attr.mode = node == kRoot ? (S_IFDIR | 0755) : (S_IFREG | 0644);
  attr.nlink = node == kRoot ? 2 : 1;
  attr.size = node == kRoot ? 0 : 4096;
  attr.uid = getuid();
  attr.gid = getgid();
  attr.blksize = 4096;
  return attr;
}

}  // namespace

StallingFuse::StallingFuse() {
  char dir[] = "/tmp/komputed-fuse-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    error_ = absl::StrCat("mkdtemp: ", std::strerror(errno));
    return;
  }
  dir_ = dir;
  fuse_fd_ = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fuse_fd_ < 0) {
    error_ = absl::StrCat("/dev/fuse: ", std::strerror(errno));
    return;
  }
  const std::string options =
      absl::StrCat("fd=", fuse_fd_, ",rootmode=40000,user_id=", getuid(), ",group_id=", getgid());
  if (mount("komputed-test", dir_.c_str(), "fuse", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
    error_ = absl::StrCat("mounting FUSE on ", dir_, ": ", std::strerror(errno));
    return;
  }
  mounted_ = true;
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  server_ = std::thread([this] { Serve(); });
}

StallingFuse::~StallingFuse() {
  Release();
  if (server_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    server_.join();
  }
  if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  if (fuse_fd_ >= 0) close(fuse_fd_);  // ends the connection: closes still waiting fail
  if (stop_fd_ >= 0) close(stop_fd_);
  if (!dir_.empty()) rmdir(dir_.c_str());
}

void StallingFuse::Stall() {
  absl::MutexLock lock(&mu_);
  stall_ = true;
}

void StallingFuse::Release() {
  std::vector<uint64_t> held;
  {
    absl::MutexLock lock(&mu_);
    stall_ = false;
    held.swap(held_);
  }
  for (uint64_t unique : held) Reply(unique, 0, nullptr, 0);
}

void StallingFuse::Reply(uint64_t unique, int error, const void* payload, size_t size) {
  char out[sizeof(fuse_out_header) + sizeof(fuse_entry_out) + sizeof(fuse_init_out)];
  fuse_out_header header{};
  header.len = static_cast<uint32_t>(sizeof(header) + size);
  header.error = error;
  header.unique = unique;
  std::memcpy(out, &header, sizeof(header));
  if (size > 0) std::memcpy(out + sizeof(header), payload, size);
  (void)!write(fuse_fd_, out, header.len);
}

void StallingFuse::Serve() {
  std::vector<char> buffer(kMaxWrite + 64 * 1024);
  for (;;) {
    pollfd polled[2] = {{fuse_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(polled, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (polled[1].revents != 0) return;
    const ssize_t n = read(fuse_fd_, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR || errno == ENOENT || errno == EAGAIN) continue;
      return;  // ENODEV: unmounted
    }
    if (static_cast<size_t>(n) < sizeof(fuse_in_header)) continue;
    fuse_in_header in;
    std::memcpy(&in, buffer.data(), sizeof(in));
    const char* body = buffer.data() + sizeof(in);
    switch (in.opcode) {
      case FUSE_INIT: {
        fuse_init_in init;
        std::memcpy(&init, body, sizeof(init.major) * 4);
        fuse_init_out out{};
        out.major = FUSE_KERNEL_VERSION;
        out.minor = FUSE_KERNEL_MINOR_VERSION;
        out.max_readahead = init.max_readahead;
        out.max_background = 16;
        out.congestion_threshold = 12;
        out.max_write = kMaxWrite;
        out.time_gran = 1;
        out.max_pages = kMaxWrite / 4096;
        Reply(in.unique, 0, &out, sizeof(out));
        break;
      }
      case FUSE_LOOKUP: {
        if (in.nodeid != kRoot || std::strcmp(body, "file") != 0) {
          Reply(in.unique, -ENOENT, nullptr, 0);
          break;
        }
        fuse_entry_out out{};
        out.nodeid = kFile;
        out.attr = Attributes(kFile);
        Reply(in.unique, 0, &out, sizeof(out));
        break;
      }
      case FUSE_GETATTR: {
        fuse_attr_out out{};
        out.attr = Attributes(in.nodeid);
        Reply(in.unique, 0, &out, sizeof(out));
        break;
      }
      case FUSE_OPEN:
      case FUSE_OPENDIR: {
        fuse_open_out out{};
        out.fh = 1;
        Reply(in.unique, 0, &out, sizeof(out));
        break;
      }
      case FUSE_FLUSH: {
        flushes_.fetch_add(1);
        {
          absl::MutexLock lock(&mu_);
          if (stall_) {
            held_.push_back(in.unique);
            break;
          }
        }
        Reply(in.unique, 0, nullptr, 0);
        break;
      }
      case FUSE_RELEASE:
      case FUSE_RELEASEDIR:
        Reply(in.unique, 0, nullptr, 0);
        break;
      case FUSE_FORGET:
      case FUSE_BATCH_FORGET:
      case FUSE_INTERRUPT:
        break;  // no answer: an interrupted FLUSH stays held
      default:
        Reply(in.unique, -ENOSYS, nullptr, 0);
    }
  }
}

}  // namespace komputed::test_support
