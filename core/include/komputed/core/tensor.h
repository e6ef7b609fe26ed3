#pragma once

#include <vulkan/vulkan_core.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"
#include "komputed/core/memory_pool.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/types.h"

namespace komputed::core {

// Host memory that a tensor takes for its host data instead of allocating its own: memory that
// this process shares with another (the daemon's same-host clients). `data` is aligned to the
// device's host_import_alignment() and `size` is a multiple of it, at least the tensor's bytes
// rounded up to 4; `keep` owns the memory and is held until the device no longer uses it.
class ImportedMemory;
struct HostMemory {
  void* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<void> keep;
  // Set: the memory imported already (ImportHostMemory), which the buffer made over it binds.
  std::shared_ptr<const ImportedMemory> imported;
};

// Device memory imported from host memory (VK_EXT_external_memory_host), host-coherent. Holds the
// host memory (HostMemory::keep) until the device memory is freed.
class ImportedMemory {
 public:
  ImportedMemory(MemoryHandle memory, uint32_t type, std::shared_ptr<void> keep)
      : keep_(std::move(keep)), memory_(std::move(memory)), type_(type) {}
  VkDeviceMemory memory() const { return memory_.get(); }
  uint32_t type() const { return type_; }

 private:
  std::shared_ptr<void> keep_;  // released after memory_
  MemoryHandle memory_;
  uint32_t type_;
};

// Imports `memory` into the device, so that a refusal comes before anything depends on it.
// UNIMPLEMENTED where the device cannot import host memory or has no host-coherent memory type for
// it; INVALID_ARGUMENT for misaligned memory or memory that the driver does not take.
absl::StatusOr<std::shared_ptr<const ImportedMemory>> ImportHostMemory(Device& device,
                                                                       const HostMemory& memory,
                                                                       absl::string_view what);

// One buffer and the memory bound to it, mapped when host-visible. Move-only.
class Buffer {
 public:
  // A host-coherent buffer over `memory` (VK_EXT_external_memory_host), bound to its import when
  // it has one (else imported here). Errors as ImportHostMemory's, and INVALID_ARGUMENT when
  // `memory` is smaller than `size` or its import's memory type does not suit the buffer.
  static absl::StatusOr<Buffer> Import(Device& device, const HostMemory& memory, uint64_t size,
                                       VkBufferUsageFlags usage, absl::string_view what);
  // required: memory properties the buffer must have; preferred: ones to pick when offered.
  // With `pool` (of `device`), memory that it serves comes from it.
  static absl::StatusOr<Buffer> Create(Device& device, uint64_t size, VkBufferUsageFlags usage,
                                       VkMemoryPropertyFlags required,
                                       VkMemoryPropertyFlags preferred, absl::string_view what,
                                       MemoryPool* pool = nullptr);
  Buffer() = default;
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  VkBuffer handle() const { return buffer_.get(); }
  void* mapped() const { return mapped_; }
  uint64_t size() const { return size_; }
  VkMemoryPropertyFlags properties() const { return properties_; }
  // Whether its memory is a piece of a MemoryPool's block.
  bool pooled() const { return static_cast<bool>(piece_); }

 private:
  std::shared_ptr<void> keep_;  // imported host memory: released after the memory made over it
  std::shared_ptr<const ImportedMemory> imported_;  // released after the buffer bound to it
  MemoryPiece piece_;                               // given back after the buffer bound to it
  BufferHandle buffer_;
  MemoryHandle memory_;  // declared after buffer_: destroyed before it... order does not matter
  void* mapped_ = nullptr;
  uint64_t size_ = 0;
  VkMemoryPropertyFlags properties_ = 0;
};

// A 2-D image in device memory with its view, always in VK_IMAGE_LAYOUT_GENERAL once initialised
// (storage image, copy source and destination at once). Move-only.
class DeviceImage {
 public:
  // Errors: INVALID_ARGUMENT when the device cannot use `format` as a storage image with copies
  // (naming the format), RESOURCE_EXHAUSTED past the device's image limits or memory heap.
  static absl::StatusOr<DeviceImage> Create(Device& device, const ImageShape& shape,
                                            VkFormat format, absl::string_view what);
  DeviceImage() = default;
  DeviceImage(DeviceImage&&) = default;
  DeviceImage& operator=(DeviceImage&&) = default;

  VkImage handle() const { return image_.get(); }
  VkImageView view() const { return view_.get(); }

 private:
  // Destroyed in reverse order: the view, the image, then its memory.
  MemoryHandle memory_;
  ImageHandle image_;
  ImageViewHandle view_;
};

// The Vulkan format of an image of `channels` elements of `type` per texel: the UINT/SINT
// formats for integers (bits round-trip; GLSL r8ui, rg16i, rgba32ui...), SFLOAT for float16 and
// float32 (r16f, rgba32f...). VK_FORMAT_UNDEFINED for a type that images cannot hold.
VkFormat ImageFormat(ElementType type, uint32_t channels);

// When a new tensor's device memory gets its first contents. Memory the host can map is written
// at once either way; the choice is for device memory the host cannot reach, which a command on a
// queue must fill.
enum class TensorInit {
  // Create runs the command on queue 0 and waits for it (in-process programs).
  kWait,
  // Create only prepares it: the tensor reports init_pending(), and the owner records the command
  // with TensorInitBatch ahead of the first submission that may use the tensor (the daemon: no
  // serving thread waits behind another session's work on the queue).
  kDeferred,
};

// A typed array in device memory (Kompute's Tensor). Its host data, when it has any, stays mapped
// for the tensor's life. Immutable shape; thread-safe except for the host data, which the owner
// writes and reads between submissions.
class Tensor {
 public:
  // count elements of `type` (of element_size bytes when type is kBytes; otherwise element_size
  // must be 0 or the type's size). `initial` (nullable) holds count * element size bytes; without
  // it the tensor is zero-filled. Errors: INVALID_ARGUMENT for a zero size, RESOURCE_EXHAUSTED
  // for a size beyond the memory heap or the device's buffer limit.
  // With `host_memory`, the tensor's host data is that memory (kDevice: its staging buffer; kHost:
  // the buffer itself) and its initial contents are the memory's, not `initial`: UNIMPLEMENTED for
  // other memory types or where Buffer::Import is.
  // With `pool` (of `device`), the buffers' memory comes from it where it serves them
  // (MemoryPool::Serves: small buffers).
  static absl::StatusOr<std::shared_ptr<Tensor>> Create(
      std::shared_ptr<Device> device, ElementType type, uint64_t count, uint32_t element_size,
      MemoryType memory, const void* initial, TensorInit init = TensorInit::kWait,
      const HostMemory* host_memory = nullptr, MemoryPool* pool = nullptr);

  // A 2-D image (shape.is_image(); CheckImageShape in types.h): its device memory is a
  // DeviceImage, which shaders bind as a storage image; its host data (kDevice) is the texels,
  // row-major and tightly packed. Errors as Create's, and INVALID_ARGUMENT for a shape that
  // CheckImageShape refuses or a format that the device lacks.
  // `host_memory` as Create's (kDevice only).
  static absl::StatusOr<std::shared_ptr<Tensor>> CreateImage(
      std::shared_ptr<Device> device, ElementType type, const ImageShape& shape, MemoryType memory,
      const void* initial, TensorInit init = TensorInit::kWait,
      const HostMemory* host_memory = nullptr);

  ElementType element_type() const { return type_; }
  MemoryType memory_type() const { return memory_; }
  // What the operation rules (op_semantics.h) need to know of this tensor.
  TensorFacts facts() const { return {this, type_, element_size_, count_, memory_, shape_}; }
  // Set for an image (CreateImage); a buffer's is all zeros.
  const ImageShape& image_shape() const { return shape_; }
  bool is_image() const { return shape_.is_image(); }
  uint64_t count() const { return count_; }
  uint32_t element_size() const { return element_size_; }
  uint64_t byte_size() const { return count_ * element_size_; }
  Device& device() const { return *device_; }

  // The host copy: the staging buffer (kDevice), the buffer itself (kHost, kDeviceAndHost), or
  // nullptr (kStorage).
  void* host_data() const;
  // The buffer that shaders bind (VK_NULL_HANDLE for an image).
  VkBuffer buffer() const { return primary_.handle(); }
  // An image's image, view and format (VK_NULL_HANDLE / VK_FORMAT_UNDEFINED for a buffer).
  VkImage image() const { return image_.handle(); }
  VkImageView image_view() const { return image_.view(); }
  VkFormat format() const {
    return is_image() ? ImageFormat(type_, shape_.channels) : VK_FORMAT_UNDEFINED;
  }
  // The staging buffer, or VK_NULL_HANDLE when the tensor has none.
  VkBuffer staging() const { return staging_.handle(); }

  // Commands: staging → device (a no-op without staging), device → staging, this → dst (buffers
  // and images in any pairing; an image's layout stays GENERAL).
  void RecordToDevice(VkCommandBuffer cb) const;
  void RecordToHost(VkCommandBuffer cb) const;
  void RecordCopyTo(VkCommandBuffer cb, const Tensor& dst) const;
  // A buffer memory barrier over the primary buffer, or an image memory barrier over the image
  // (or, when !primary and there is one, over the staging buffer).
  void RecordBarrier(VkCommandBuffer cb, VkAccessFlags src_access, VkAccessFlags dst_access,
                     VkPipelineStageFlags src_stage, VkPipelineStageFlags dst_stage,
                     bool primary) const;

  // The host data is HostMemory given at creation.
  bool host_memory_imported() const { return host_imported_; }
  // Created with TensorInit::kDeferred and its device memory not yet given its first contents.
  bool init_pending() const { return init_pending_.load(std::memory_order_acquire); }

 private:
  friend class TensorInitBatch;
  Tensor() = default;
  // The parts of Create and CreateImage after the device memory exists: host data, first contents.
  static absl::StatusOr<std::shared_ptr<Tensor>> Finish(std::shared_ptr<Tensor> t,
                                                        const void* initial, TensorInit init);
  // Records the commands that give the primary buffer its first contents (the initial data from
  // staging or the upload buffer, else zeros).
  void RecordInit(VkCommandBuffer cb) const;

  std::shared_ptr<Device> device_;
  ElementType type_ = ElementType::kFloat32;
  MemoryType memory_ = MemoryType::kDevice;
  uint64_t count_ = 0;
  uint32_t element_size_ = 0;
  ImageShape shape_;
  Buffer primary_;     // a buffer's device memory
  DeviceImage image_;  // an image's
  Buffer staging_;
  // A storage tensor's initial data until its deferred init has run (then the batch holds it).
  std::shared_ptr<Buffer> upload_;
  std::atomic<bool> init_pending_{false};
  bool host_imported_ = false;
};

// The deferred inits of some tensors (TensorInit::kDeferred) recorded into one command buffer,
// which ends with a barrier that makes them visible to every later command on its queue. Submit it
// ahead of a submission (Sequence::Submit's prologue) and keep the batch until that submission has
// completed; once the submission is made, Submitted() marks the tensors initialised. Holds the
// tensors and their upload buffers. Not thread-safe.
class TensorInitBatch {
 public:
  // For a queue of `queue_family`; tensors that are no longer pending are skipped. NOT_FOUND when
  // none is pending (nothing to submit).
  static absl::StatusOr<std::shared_ptr<TensorInitBatch>> Record(
      std::shared_ptr<Device> device, uint32_t queue_family,
      const std::vector<std::shared_ptr<Tensor>>& tensors);
  ~TensorInitBatch();
  TensorInitBatch(const TensorInitBatch&) = delete;
  TensorInitBatch& operator=(const TensorInitBatch&) = delete;

  VkCommandBuffer command_buffer() const { return cb_; }
  // The submission that carries the batch was made: its tensors are initialised from now on.
  void Submitted();

 private:
  TensorInitBatch() = default;

  std::shared_ptr<Device> device_;
  CommandPoolHandle pool_;
  VkCommandBuffer cb_ = VK_NULL_HANDLE;  // freed with pool_
  std::vector<std::shared_ptr<Tensor>> tensors_;
  std::vector<std::shared_ptr<Buffer>> uploads_;
};

}  // namespace komputed::core
