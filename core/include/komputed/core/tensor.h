#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "komputed/core/device.h"
#include "komputed/core/handle.h"
#include "komputed/core/op_semantics.h"
#include "komputed/core/types.h"

namespace komputed::core {

// One buffer and the memory bound to it, mapped when host-visible. Move-only.
class Buffer {
 public:
  // required: memory properties the buffer must have; preferred: ones to pick when offered.
  static absl::StatusOr<Buffer> Create(Device& device, uint64_t size, VkBufferUsageFlags usage,
                                       VkMemoryPropertyFlags required,
                                       VkMemoryPropertyFlags preferred, absl::string_view what);
  Buffer() = default;
  Buffer(Buffer&&) = default;
  Buffer& operator=(Buffer&&) = default;

  VkBuffer handle() const { return buffer_.get(); }
  void* mapped() const { return mapped_; }
  uint64_t size() const { return size_; }
  VkMemoryPropertyFlags properties() const { return properties_; }

 private:
  BufferHandle buffer_;
  MemoryHandle memory_;  // declared after buffer_: destroyed before it... order does not matter
  void* mapped_ = nullptr;
  uint64_t size_ = 0;
  VkMemoryPropertyFlags properties_ = 0;
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
  static absl::StatusOr<std::shared_ptr<Tensor>> Create(std::shared_ptr<Device> device,
                                                        ElementType type, uint64_t count,
                                                        uint32_t element_size, MemoryType memory,
                                                        const void* initial);

  ElementType element_type() const { return type_; }
  MemoryType memory_type() const { return memory_; }
  // What the operation rules (op_semantics.h) need to know of this tensor.
  TensorFacts facts() const { return {this, type_, element_size_, count_, memory_}; }
  uint64_t count() const { return count_; }
  uint32_t element_size() const { return element_size_; }
  uint64_t byte_size() const { return count_ * element_size_; }
  Device& device() const { return *device_; }

  // The host copy: the staging buffer (kDevice), the buffer itself (kHost, kDeviceAndHost), or
  // nullptr (kStorage).
  void* host_data() const;
  // The buffer that shaders bind.
  VkBuffer buffer() const { return primary_.handle(); }
  // The staging buffer, or VK_NULL_HANDLE when the tensor has none.
  VkBuffer staging() const { return staging_.handle(); }

  // Commands: staging → device (a no-op without staging), device → staging, this → dst.
  void RecordToDevice(VkCommandBuffer cb) const;
  void RecordToHost(VkCommandBuffer cb) const;
  void RecordCopyTo(VkCommandBuffer cb, const Tensor& dst) const;
  // A buffer memory barrier over the primary buffer (or the staging buffer when !primary and
  // there is one).
  void RecordBarrier(VkCommandBuffer cb, VkAccessFlags src_access, VkAccessFlags dst_access,
                     VkPipelineStageFlags src_stage, VkPipelineStageFlags dst_stage,
                     bool primary) const;

 private:
  Tensor() = default;

  std::shared_ptr<Device> device_;
  ElementType type_ = ElementType::kFloat32;
  MemoryType memory_ = MemoryType::kDevice;
  uint64_t count_ = 0;
  uint32_t element_size_ = 0;
  Buffer primary_;
  Buffer staging_;
};

}  // namespace komputed::core
