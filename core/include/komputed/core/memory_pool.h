#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"

namespace komputed::core {

class MemoryPool;

// A range of one of a MemoryPool's blocks, which a buffer binds at offset(). Gives the range back
// to its pool when destroyed (after the buffer bound to it: declare it before the buffer).
// Move-only.
class MemoryPiece {
 public:
  MemoryPiece() = default;
  MemoryPiece(MemoryPiece&& other) noexcept;
  MemoryPiece& operator=(MemoryPiece&& other) noexcept;
  MemoryPiece(const MemoryPiece&) = delete;
  MemoryPiece& operator=(const MemoryPiece&) = delete;
  ~MemoryPiece() { Reset(); }

  void Reset();
  explicit operator bool() const { return pool_ != nullptr; }
  VkDeviceMemory memory() const { return memory_; }
  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  // The piece's bytes where its block is mapped (every host-visible block is), else null.
  void* mapped() const { return mapped_; }

 private:
  friend class MemoryPool;
  std::shared_ptr<MemoryPool> pool_;  // keeps the block's memory until the piece is back
  const void* block_ = nullptr;       // the pool's block, an identity only
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
  void* mapped_ = nullptr;
};

// Device memory for small buffers, carved from blocks that many buffers share: each allocation
// of device memory costs the driver host memory of its own (about 4 KiB on lavapipe's and
// NVIDIA's drivers, whatever its size), and drivers cap the number of allocations
// (maxMemoryAllocationCount). Blocks are per memory type, mapped whole when host-visible, and
// freed when their last piece is given back. A piece's bytes are whatever its previous owner
// left: the owner initialises them (Tensor does).
//
// The daemon keeps one pool per tenant and device opening, so that tenants never share a block.
// Thread-safe.
class MemoryPool : public std::enable_shared_from_this<MemoryPool> {
 public:
  struct Options {
    uint64_t block_bytes = uint64_t{256} << 10;     // each block's size
    uint64_t max_piece_bytes = uint64_t{16} << 10;  // larger buffers get memory of their own
  };
  static std::shared_ptr<MemoryPool> Create(std::shared_ptr<Device> device, Options options);
  static std::shared_ptr<MemoryPool> Create(std::shared_ptr<Device> device) {
    return Create(std::move(device), Options{});
  }
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;
  ~MemoryPool();

  const Device& device() const { return *device_; }

  // Whether the pool takes requirements `req` in memory type `type`: at most max_piece_bytes, and
  // a type the host does not see or sees coherently (pieces of a non-coherent type would need
  // flushes aligned beyond their range).
  bool Serves(const VkMemoryRequirements& req, uint32_t type) const;

  // A piece for `req` of memory type `type` (which Serves), from a block with room or from a new
  // block. Errors: vkAllocateMemory's or vkMapMemory's for a new block, naming `what`; nothing is
  // taken then.
  absl::StatusOr<MemoryPiece> Allocate(const VkMemoryRequirements& req, uint32_t type,
                                       absl::string_view what);

  // What the pool holds now: its blocks, and the pieces given out of them.
  size_t blocks() const;
  uint64_t pieces() const;

 private:
  friend class MemoryPiece;
  struct Block {
    MemoryHandle memory;
    uint32_t type = 0;
    uint64_t size = 0;
    void* mapped = nullptr;
    uint64_t pieces = 0;
    absl::btree_map<uint64_t, uint64_t> free;  // offset → length, coalesced
  };
  MemoryPool(std::shared_ptr<Device> device, Options options);
  // Takes `size` bytes aligned to `alignment` from `block`; false when they do not fit.
  static bool Take(Block& block, uint64_t size, uint64_t alignment, uint64_t* offset);
  void Give(const void* block, uint64_t offset, uint64_t size);

  const std::shared_ptr<Device> device_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace komputed::core
