#include "komputed/core/memory_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"

namespace komputed::core {

MemoryPiece::MemoryPiece(MemoryPiece&& other) noexcept
    : pool_(std::move(other.pool_)),
      block_(std::exchange(other.block_, nullptr)),
      memory_(std::exchange(other.memory_, VK_NULL_HANDLE)),
      offset_(std::exchange(other.offset_, 0)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, nullptr)) {}

MemoryPiece& MemoryPiece::operator=(MemoryPiece&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::move(other.pool_);
    block_ = std::exchange(other.block_, nullptr);
    memory_ = std::exchange(other.memory_, VK_NULL_HANDLE);
    offset_ = std::exchange(other.offset_, 0);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
  }
  return *this;
}

void MemoryPiece::Reset() {
  if (pool_ == nullptr) return;
  std::shared_ptr<MemoryPool> pool = std::move(pool_);
  pool_ = nullptr;
  pool->Give(std::exchange(block_, nullptr), offset_, size_);
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

std::shared_ptr<MemoryPool> MemoryPool::Create(std::shared_ptr<Device> device, Options options) {
  return std::shared_ptr<MemoryPool>(new MemoryPool(std::move(device), options));
}

MemoryPool::MemoryPool(std::shared_ptr<Device> device, Options options)
    : device_(std::move(device)), options_(options) {}

// Every piece holds the pool, so none is out here: the blocks (none left but never-used ones)
// go with their memory handles.
MemoryPool::~MemoryPool() = default;

bool MemoryPool::Serves(const VkMemoryRequirements& req, uint32_t type) const {
  if (req.size == 0 || req.size > options_.max_piece_bytes || req.size > options_.block_bytes) {
    return false;
  }
  if (req.alignment == 0 || (req.alignment & (req.alignment - 1)) != 0 ||
      req.alignment > options_.block_bytes) {
    return false;
  }
  const VkPhysicalDeviceMemoryProperties& memory = device_->info().memory;
  if (type >= memory.memoryTypeCount) return false;
  const VkMemoryPropertyFlags flags = memory.memoryTypes[type].propertyFlags;
  if ((flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
      !(flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
    return false;
  }
  return options_.block_bytes <= device_->HeapSize(type);
}

bool MemoryPool::Take(Block& block, uint64_t size, uint64_t alignment, uint64_t* offset) {
  for (auto it = block.free.begin(); it != block.free.end(); ++it) {
    const uint64_t start = it->first;
    const uint64_t end = it->first + it->second;
    const uint64_t aligned = (start + alignment - 1) & ~(alignment - 1);
    if (aligned > end || end - aligned < size) continue;
    block.free.erase(it);
    if (aligned > start) block.free.emplace(start, aligned - start);
    if (aligned + size < end) block.free.emplace(aligned + size, end - aligned - size);
    *offset = aligned;
    return true;
  }
  return false;
}

absl::StatusOr<MemoryPiece> MemoryPool::Allocate(const VkMemoryRequirements& req, uint32_t type,
                                                 absl::string_view what) {
  if (!Serves(req, type)) {
    return absl::InternalError(absl::StrCat("the memory pool does not serve ", req.size,
                                            " bytes of memory type ", type, " for ", what));
  }
  MemoryPiece piece;
  piece.size_ = req.size;
  absl::MutexLock lock(&mu_);
  Block* chosen = nullptr;
  for (const std::unique_ptr<Block>& block : blocks_) {
    if (block->type == type && Take(*block, req.size, req.alignment, &piece.offset_)) {
      chosen = block.get();
      break;
    }
  }
  if (chosen == nullptr) {
    // A new block. The lock stays held: vkAllocateMemory does not wait for the device.
    auto block = std::make_unique<Block>();
    block->type = type;
    block->size = options_.block_bytes;
    KD_ASSIGN_OR_RETURN(block->memory, device_->AllocateMemory(block->size, type,
                                                               absl::StrCat("a block for ", what)));
    const VkDeviceMemory memory = block->memory.get();
    if (device_->info().memory.memoryTypes[type].propertyFlags &
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
      KD_RETURN_IF_ERROR(device_->Check(
          vkMapMemory(device_->handle(), memory, 0, VK_WHOLE_SIZE, 0, &block->mapped),
          absl::StrCat("vkMapMemory of a block for ", what)));
    }
    block->free.emplace(0, block->size);
    if (!Take(*block, req.size, req.alignment, &piece.offset_)) {
      return absl::InternalError(absl::StrCat("a new block of ", block->size,
                                              " bytes does not take ", req.size, " bytes"));
    }
    chosen = block.get();
    blocks_.push_back(std::move(block));
  }
  ++chosen->pieces;
  piece.block_ = chosen;
  piece.memory_ = chosen->memory.get();
  piece.mapped_ =
      chosen->mapped != nullptr ? static_cast<char*>(chosen->mapped) + piece.offset_ : nullptr;
  piece.pool_ = shared_from_this();
  return piece;
}

void MemoryPool::Give(const void* block, uint64_t offset, uint64_t size) {
  std::unique_ptr<Block> emptied;  // freed after the lock is let go
  {
    absl::MutexLock lock(&mu_);
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      Block& b = **it;
      if (&b != block) continue;
      uint64_t start = offset;
      uint64_t length = size;
      auto next = b.free.lower_bound(offset);
      if (next != b.free.end() && next->first == start + length) {
        length += next->second;
        next = b.free.erase(next);
      }
      if (next != b.free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == start) {
          start = prev->first;
          length += prev->second;
          b.free.erase(prev);
        }
      }
      b.free.emplace(start, length);
      if (--b.pieces == 0) {
        emptied = std::move(*it);
        blocks_.erase(it);
      }
      return;
    }
  }
}

size_t MemoryPool::blocks() const {
  absl::MutexLock lock(&mu_);
  return blocks_.size();
}

uint64_t MemoryPool::pieces() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const std::unique_ptr<Block>& block : blocks_) n += block->pieces;
  return n;
}

}  // namespace komputed::core
