#include "komputed/core/tensor.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"

namespace komputed::core {

namespace {

// Device memory of memory type `type` for a buffer's or an image's requirements, within the
// type's heap.
absl::StatusOr<MemoryHandle> AllocateFor(Device& device, const VkMemoryRequirements& req,
                                         uint32_t type, absl::string_view what) {
  if (req.size > device.HeapSize(type)) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", req.size,
                                                     " bytes, more than its memory heap's ",
                                                     device.HeapSize(type), " bytes"));
  }
  return device.AllocateMemory(req.size, type, what);
}

// A buffer of `size` bytes for `usage` with `next` chained to its create info, and its memory
// requirements.
absl::StatusOr<std::pair<BufferHandle, VkMemoryRequirements>> NewBuffer(Device& device,
                                                                        uint64_t size,
                                                                        VkBufferUsageFlags usage,
                                                                        const void* next,
                                                                        absl::string_view what) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.pNext = next;
  bi.size = size;
  bi.usage = usage;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(device.Check(vkCreateBuffer(device.handle(), &bi, nullptr, &buffer),
                                  absl::StrCat("vkCreateBuffer for ", what)));
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device.handle(), buffer, &req);
  return std::make_pair(BufferHandle(device.handle(), buffer), req);
}

}  // namespace

absl::StatusOr<Buffer> Buffer::Create(Device& device, uint64_t size, VkBufferUsageFlags usage,
                                      VkMemoryPropertyFlags required,
                                      VkMemoryPropertyFlags preferred, absl::string_view what,
                                      MemoryPool* pool) {
  Buffer b;
  b.size_ = size;
  KD_ASSIGN_OR_RETURN(auto made, NewBuffer(device, size, usage, nullptr, what));
  b.buffer_ = std::move(made.first);
  const VkBuffer buffer = b.buffer_.get();
  const VkMemoryRequirements& req = made.second;
  if (pool != nullptr && &pool->device() != &device) {
    return absl::InternalError(absl::StrCat("the memory pool for ", what, " is another device's"));
  }
  KD_ASSIGN_OR_RETURN(uint32_t type,
                      device.FindMemoryType(req.memoryTypeBits, required, preferred));
  b.properties_ = device.info().memory.memoryTypes[type].propertyFlags;
  const bool map =
      (b.properties_ & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
      ((required & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) || device.maps_device_memory());
  if (pool != nullptr && pool->Serves(req, type)) {
    KD_ASSIGN_OR_RETURN(b.piece_, pool->Allocate(req, type, what));
    KD_RETURN_IF_ERROR(device.Check(
        vkBindBufferMemory(device.handle(), buffer, b.piece_.memory(), b.piece_.offset()),
        "vkBindBufferMemory"));
    if (map) b.mapped_ = b.piece_.mapped();
    return b;
  }
  KD_ASSIGN_OR_RETURN(b.memory_, AllocateFor(device, req, type, what));
  const VkDeviceMemory memory = b.memory_.get();
  KD_RETURN_IF_ERROR(
      device.Check(vkBindBufferMemory(device.handle(), buffer, memory, 0), "vkBindBufferMemory"));
  if (map) {
    KD_RETURN_IF_ERROR(device.Check(
        vkMapMemory(device.handle(), memory, 0, VK_WHOLE_SIZE, 0, &b.mapped_), "vkMapMemory"));
  }
  return b;
}

absl::StatusOr<std::shared_ptr<const ImportedMemory>> ImportHostMemory(Device& device,
                                                                       const HostMemory& memory,
                                                                       absl::string_view what) {
  const uint64_t alignment = device.host_import_alignment();
  if (alignment == 0) {
    return absl::UnimplementedError(absl::StrCat("device ", device.info().index, " (",
                                                 device.properties().deviceName,
                                                 ") cannot import host memory"));
  }
  if (memory.data == nullptr || reinterpret_cast<uintptr_t>(memory.data) % alignment != 0 ||
      memory.size == 0 || memory.size % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host memory for ", what, " of ", memory.size,
                                                   " bytes is not aligned to the device's ",
                                                   alignment, " bytes"));
  }
  VkMemoryHostPointerPropertiesEXT pointer{VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  const VkResult result = device.host_pointer_properties()(
      device.handle(), VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, memory.data,
      &pointer);
  if (result != VK_SUCCESS || pointer.memoryTypeBits == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device.info().index, " (", device.properties().deviceName,
        ") does not take host memory for ", what, " (vkGetMemoryHostPointerPropertiesEXT: ",
        VkResultName(result), ", memory types 0x", absl::Hex(pointer.memoryTypeBits), ")"));
  }
  constexpr VkMemoryPropertyFlags kCoherent =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  absl::StatusOr<uint32_t> type =
      device.FindMemoryType(pointer.memoryTypeBits, kCoherent, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  if (!type.ok()) {
    return absl::UnimplementedError(
        absl::StrCat("device ", device.info().index, " (", device.properties().deviceName,
                     ") has no host-coherent memory type for imported host memory"));
  }
  VkImportMemoryHostPointerInfoEXT import{VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT};
  import.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  import.pHostPointer = memory.data;
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &import;
  ai.allocationSize = memory.size;
  ai.memoryTypeIndex = *type;
  VkDeviceMemory allocated = VK_NULL_HANDLE;
  const VkResult r = device.calls().AllocateMemory(device.handle(), &ai, &allocated);
  if (r == VK_ERROR_DEVICE_LOST) return device.Check(r, "vkAllocateMemory");
  if (r != VK_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device.info().index, " (", device.properties().deviceName,
                     ") did not import ", memory.size, " bytes of host memory for ", what,
                     " (vkAllocateMemory: ", VkResultName(r), ")"));
  }
  return std::make_shared<const ImportedMemory>(MemoryHandle(device.handle(), allocated), *type,
                                                memory.keep);
}

absl::StatusOr<Buffer> Buffer::Import(Device& device, const HostMemory& memory, uint64_t size,
                                      VkBufferUsageFlags usage, absl::string_view what) {
  std::shared_ptr<const ImportedMemory> imported = memory.imported;
  if (imported == nullptr) {
    KD_ASSIGN_OR_RETURN(imported, ImportHostMemory(device, memory, what));
  }
  if (memory.size < size) {
    return absl::InvalidArgumentError(absl::StrCat("host memory for ", what, " of ", memory.size,
                                                   " bytes is smaller than its ", size, " bytes"));
  }
  Buffer b;
  b.keep_ = memory.keep;
  b.size_ = size;
  VkExternalMemoryBufferCreateInfo external{VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO};
  external.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
  KD_ASSIGN_OR_RETURN(auto made, NewBuffer(device, size, usage, &external, what));
  b.buffer_ = std::move(made.first);
  const VkBuffer buffer = b.buffer_.get();
  const VkMemoryRequirements& req = made.second;
  if (req.size > memory.size || (req.memoryTypeBits & (1u << imported->type())) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host memory for ", what, " of ", memory.size, " bytes (memory type ",
                     imported->type(), ") does not suit a buffer that needs ", req.size,
                     " bytes of memory types 0x", absl::Hex(req.memoryTypeBits)));
  }
  KD_RETURN_IF_ERROR(device.Check(
      vkBindBufferMemory(device.handle(), buffer, imported->memory(), 0), "vkBindBufferMemory"));
  b.imported_ = std::move(imported);
  b.properties_ = device.info().memory.memoryTypes[b.imported_->type()].propertyFlags;
  b.mapped_ = memory.data;
  return b;
}

VkFormat ImageFormat(ElementType type, uint32_t channels) {
  if (channels < 1 || channels > 4) return VK_FORMAT_UNDEFINED;
  static constexpr VkFormat kFormats[][4] = {
      {VK_FORMAT_R8_SINT, VK_FORMAT_R8G8_SINT, VK_FORMAT_R8G8B8_SINT, VK_FORMAT_R8G8B8A8_SINT},
      {VK_FORMAT_R8_UINT, VK_FORMAT_R8G8_UINT, VK_FORMAT_R8G8B8_UINT, VK_FORMAT_R8G8B8A8_UINT},
      {VK_FORMAT_R16_SINT, VK_FORMAT_R16G16_SINT, VK_FORMAT_R16G16B16_SINT,
       VK_FORMAT_R16G16B16A16_SINT},
      {VK_FORMAT_R16_UINT, VK_FORMAT_R16G16_UINT, VK_FORMAT_R16G16B16_UINT,
       VK_FORMAT_R16G16B16A16_UINT},
      {VK_FORMAT_R16_SFLOAT, VK_FORMAT_R16G16_SFLOAT, VK_FORMAT_R16G16B16_SFLOAT,
       VK_FORMAT_R16G16B16A16_SFLOAT},
      {VK_FORMAT_R32_SINT, VK_FORMAT_R32G32_SINT, VK_FORMAT_R32G32B32_SINT,
       VK_FORMAT_R32G32B32A32_SINT},
      {VK_FORMAT_R32_UINT, VK_FORMAT_R32G32_UINT, VK_FORMAT_R32G32B32_UINT,
       VK_FORMAT_R32G32B32A32_UINT},
      {VK_FORMAT_R32_SFLOAT, VK_FORMAT_R32G32_SFLOAT, VK_FORMAT_R32G32B32_SFLOAT,
       VK_FORMAT_R32G32B32A32_SFLOAT},
  };
  const int row = ImageElementIndex(type);
  if (row < 0) return VK_FORMAT_UNDEFINED;
  return kFormats[row][channels - 1];
}

absl::StatusOr<DeviceImage> DeviceImage::Create(Device& device, const ImageShape& shape,
                                                VkFormat format, absl::string_view what) {
  // The format must serve as a storage image and (Vulkan 1.1 reports these) a copy source and
  // destination, with optimal tiling.
  VkFormatProperties fp{};
  vkGetPhysicalDeviceFormatProperties(device.physical_device(), format, &fp);
  VkFormatFeatureFlags needed = VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT;
  if (device.properties().apiVersion >= VK_API_VERSION_1_1) {
    needed |= VK_FORMAT_FEATURE_TRANSFER_SRC_BIT | VK_FORMAT_FEATURE_TRANSFER_DST_BIT;
  }
  if ((fp.optimalTilingFeatures & needed) != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": device ", device.info().index, " (", device.properties().deviceName,
                     ") cannot use Vulkan format ", static_cast<int>(format),
                     " as a storage image with copies (formats of 3 channels rarely can: use 4)"));
  }
  constexpr VkImageUsageFlags kUsage = VK_IMAGE_USAGE_STORAGE_BIT |
                                       VK_IMAGE_USAGE_TRANSFER_SRC_BIT |
                                       VK_IMAGE_USAGE_TRANSFER_DST_BIT;
  VkImageFormatProperties ip{};
  const VkResult r = vkGetPhysicalDeviceImageFormatProperties(
      device.physical_device(), format, VK_IMAGE_TYPE_2D, VK_IMAGE_TILING_OPTIMAL, kUsage, 0, &ip);
  if (r != VK_SUCCESS || shape.width > ip.maxExtent.width || shape.height > ip.maxExtent.height) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " of ", shape.width, "x", shape.height, " texels is over the device's limit of ",
        r == VK_SUCCESS ? ip.maxExtent.width : 0, "x", r == VK_SUCCESS ? ip.maxExtent.height : 0));
  }
  DeviceImage out;
  const VkDevice dev = device.handle();
  VkImageCreateInfo ii{VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO};
  ii.imageType = VK_IMAGE_TYPE_2D;
  ii.format = format;
  ii.extent = {shape.width, shape.height, 1};
  ii.mipLevels = 1;
  ii.arrayLayers = 1;
  ii.samples = VK_SAMPLE_COUNT_1_BIT;
  ii.tiling = VK_IMAGE_TILING_OPTIMAL;
  ii.usage = kUsage;
  ii.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  ii.initialLayout = VK_IMAGE_LAYOUT_UNDEFINED;
  VkImage image = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(device.Check(vkCreateImage(dev, &ii, nullptr, &image),
                                  absl::StrCat("vkCreateImage for ", what)));
  out.image_ = ImageHandle(dev, image);
  VkMemoryRequirements req;
  vkGetImageMemoryRequirements(dev, image, &req);
  KD_ASSIGN_OR_RETURN(uint32_t type, device.FindMemoryType(req.memoryTypeBits,
                                                           VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0));
  KD_ASSIGN_OR_RETURN(out.memory_, AllocateFor(device, req, type, what));
  const VkDeviceMemory memory = out.memory_.get();
  KD_RETURN_IF_ERROR(device.Check(vkBindImageMemory(dev, image, memory, 0), "vkBindImageMemory"));
  VkImageViewCreateInfo vi{VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO};
  vi.image = image;
  vi.viewType = VK_IMAGE_VIEW_TYPE_2D;
  vi.format = format;
  vi.subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
  VkImageView view = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      device.Check(vkCreateImageView(dev, &vi, nullptr, &view), "vkCreateImageView"));
  out.view_ = ImageViewHandle(dev, view);
  return out;
}

absl::StatusOr<std::shared_ptr<Tensor>> Tensor::CreateImage(
    std::shared_ptr<Device> device, ElementType type, const ImageShape& shape, MemoryType memory,
    const void* initial, TensorInit init, const HostMemory* host_memory) {
  KD_RETURN_IF_ERROR(CheckImageShape(type, memory, shape));
  if (host_memory != nullptr && memory != MemoryType::kDevice) {
    return absl::UnimplementedError(
        absl::StrCat("a ", MemoryTypeName(memory), " image cannot take shared host memory"));
  }
  const VkPhysicalDeviceLimits& limits = device->limits();
  if (shape.width > limits.maxImageDimension2D || shape.height > limits.maxImageDimension2D) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "an image of ", shape.width, "x", shape.height,
        " texels is over the device's maxImageDimension2D (", limits.maxImageDimension2D, ")"));
  }
  auto t = std::shared_ptr<Tensor>(new Tensor());
  t->device_ = device;
  t->type_ = type;
  t->memory_ = memory;
  t->shape_ = shape;
  t->element_size_ = ElementTypeSize(type);
  t->count_ = shape.count();
  const uint64_t bytes = t->byte_size();
  const std::string what =
      absl::StrCat("a ", MemoryTypeName(memory), " image of ", shape.width, "x", shape.height, "x",
                   shape.channels, " ", ElementTypeName(type));
  KD_ASSIGN_OR_RETURN(t->image_,
                      DeviceImage::Create(*device, shape, ImageFormat(type, shape.channels), what));
  if (host_memory != nullptr) {
    KD_ASSIGN_OR_RETURN(
        t->staging_,
        Buffer::Import(*device, *host_memory, (bytes + 3) & ~uint64_t{3},
                       VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                       absl::StrCat("the staging buffer of ", what)));
    t->host_imported_ = true;
  } else if (memory == MemoryType::kDevice) {
    KD_ASSIGN_OR_RETURN(
        t->staging_,
        Buffer::Create(*device, (bytes + 3) & ~uint64_t{3},
                       VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                       VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                       VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                       absl::StrCat("the staging buffer of ", what)));
  }
  return Finish(std::move(t), initial, init);
}

namespace {

// The whole of an image as a copy region to or from tightly packed texels in a buffer.
VkBufferImageCopy WholeImage(const ImageShape& shape) {
  VkBufferImageCopy region{};
  region.imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
  region.imageExtent = {shape.width, shape.height, 1};
  return region;
}

void ImageBarrier(VkCommandBuffer cb, VkImage image, VkImageLayout from, VkAccessFlags src_access,
                  VkAccessFlags dst_access, VkPipelineStageFlags src_stage,
                  VkPipelineStageFlags dst_stage) {
  VkImageMemoryBarrier b{VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER};
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  b.oldLayout = from;
  b.newLayout = VK_IMAGE_LAYOUT_GENERAL;
  b.srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
  b.dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
  b.image = image;
  b.subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 0, nullptr, 0, nullptr, 1, &b);
}

}  // namespace

absl::StatusOr<std::shared_ptr<Tensor>> Tensor::Create(std::shared_ptr<Device> device,
                                                       ElementType type, uint64_t count,
                                                       uint32_t element_size, MemoryType memory,
                                                       const void* initial, TensorInit init,
                                                       const HostMemory* host_memory,
                                                       MemoryPool* pool) {
  KD_ASSIGN_OR_RETURN(element_size, CheckTensorShape(type, memory, count, element_size));
  if (host_memory != nullptr && memory != MemoryType::kDevice && memory != MemoryType::kHost) {
    return absl::UnimplementedError(
        absl::StrCat("a ", MemoryTypeName(memory), " tensor cannot take shared host memory"));
  }
  const uint64_t bytes = count * element_size;
  const PhysicalDeviceInfo& info = device->info();
  if (info.max_buffer_size != 0 && bytes > info.max_buffer_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor of ", bytes, " bytes exceeds the device's maxBufferSize of ",
                     info.max_buffer_size, " bytes"));
  }

  auto t = std::shared_ptr<Tensor>(new Tensor());
  t->device_ = device;
  t->type_ = type;
  t->memory_ = memory;
  t->count_ = count;
  t->element_size_ = element_size;

  // Buffers are a whole number of 4-byte words, so that vkCmdFillBuffer clears every byte.
  const uint64_t alloc = (bytes + 3) & ~uint64_t{3};
  constexpr VkBufferUsageFlags kUsage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  constexpr VkMemoryPropertyFlags kHostVisible =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const std::string what =
      absl::StrCat("a ", MemoryTypeName(memory), " tensor of ", bytes, " bytes");
  t->host_imported_ = host_memory != nullptr;
  switch (memory) {
    case MemoryType::kDevice: {
      KD_ASSIGN_OR_RETURN(
          t->primary_, Buffer::Create(*device, alloc, kUsage, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                      0, what, pool));
      constexpr VkBufferUsageFlags kStaging =
          VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
      const std::string staging = absl::StrCat("the staging buffer of ", what);
      if (host_memory != nullptr) {
        KD_ASSIGN_OR_RETURN(t->staging_,
                            Buffer::Import(*device, *host_memory, alloc, kStaging, staging));
      } else {
        KD_ASSIGN_OR_RETURN(t->staging_,
                            Buffer::Create(*device, alloc, kStaging, kHostVisible,
                                           VK_MEMORY_PROPERTY_HOST_CACHED_BIT, staging, pool));
      }
      break;
    }
    case MemoryType::kHost: {
      if (host_memory != nullptr) {
        KD_ASSIGN_OR_RETURN(t->primary_,
                            Buffer::Import(*device, *host_memory, alloc, kUsage, what));
      } else {
        KD_ASSIGN_OR_RETURN(t->primary_,
                            Buffer::Create(*device, alloc, kUsage, kHostVisible,
                                           VK_MEMORY_PROPERTY_HOST_CACHED_BIT, what, pool));
      }
      break;
    }
    case MemoryType::kStorage: {
      KD_ASSIGN_OR_RETURN(
          t->primary_, Buffer::Create(*device, alloc, kUsage, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                      0, what, pool));
      break;
    }
    case MemoryType::kDeviceAndHost: {
      KD_ASSIGN_OR_RETURN(
          t->primary_,
          Buffer::Create(*device, alloc, kUsage, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | kHostVisible,
                         0, what, pool));
      break;
    }
  }

  return Finish(std::move(t), initial, init);
}

absl::StatusOr<std::shared_ptr<Tensor>> Tensor::Finish(std::shared_ptr<Tensor> t,
                                                       const void* initial, TensorInit init) {
  const std::shared_ptr<Device>& device = t->device_;
  const uint64_t bytes = t->byte_size();
  const uint64_t alloc = (bytes + 3) & ~uint64_t{3};
  constexpr VkMemoryPropertyFlags kHostVisible =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const MemoryType memory = t->memory_;
  // Initial contents: the given data, or zeros (new memory may hold another program's data).
  // Host data first; then the primary buffer, directly where the host maps it (host memory, and
  // device memory on a device whose memory is all host-visible), else by a command on a queue.
  auto fill = [&](void* to) {
    if (initial != nullptr) std::memcpy(to, initial, bytes);
    std::memset(static_cast<uint8_t*>(to) + (initial != nullptr ? bytes : 0), 0,
                initial != nullptr ? alloc - bytes : alloc);
  };
  // Imported host memory keeps what its owner put there, and is the initial data.
  if (t->host_imported_) initial = t->host_data();
  if (void* host = t->host_data(); host != nullptr && !t->host_imported_) fill(host);
  if (t->primary_.mapped() != nullptr) {
    if (t->primary_.mapped() != t->host_data()) fill(t->primary_.mapped());
    return t;
  }
  // A storage tensor's initial data, and imported host memory's contents as they are now (their
  // owner may change them before the init runs), go up from an upload buffer of their own.
  if ((memory == MemoryType::kStorage && initial != nullptr) || t->host_imported_) {
    KD_ASSIGN_OR_RETURN(Buffer upload,
                        Buffer::Create(*device, alloc, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                       kHostVisible, 0, "an upload buffer"));
    fill(upload.mapped());
    t->upload_ = std::make_shared<Buffer>(std::move(upload));
  }
  if (init == TensorInit::kDeferred) {
    t->init_pending_.store(true, std::memory_order_release);
    return t;
  }
  KD_RETURN_IF_ERROR(device->RunOnce([&](VkCommandBuffer cb) { t->RecordInit(cb); }));
  t->upload_.reset();
  return t;
}

void Tensor::RecordInit(VkCommandBuffer cb) const {
  if (is_image()) {
    // Into GENERAL, where it stays; then the texels from staging or upload, else zeros.
    ImageBarrier(cb, image_.handle(), VK_IMAGE_LAYOUT_UNDEFINED, 0, VK_ACCESS_TRANSFER_WRITE_BIT,
                 VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
    const Buffer* from = upload_ != nullptr ? upload_.get() : &staging_;
    if (from->handle() != VK_NULL_HANDLE) {
      const VkBufferImageCopy region = WholeImage(shape_);
      vkCmdCopyBufferToImage(cb, from->handle(), image_.handle(), VK_IMAGE_LAYOUT_GENERAL, 1,
                             &region);
    } else {
      const VkClearColorValue zero{};
      const VkImageSubresourceRange range{VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
      vkCmdClearColorImage(cb, image_.handle(), VK_IMAGE_LAYOUT_GENERAL, &zero, 1, &range);
    }
    return;
  }
  const uint64_t alloc = primary_.size();  // the padding too: zeros in staging and upload
  const Buffer* from = upload_ != nullptr ? upload_.get() : &staging_;
  if (from->handle() != VK_NULL_HANDLE) {
    VkBufferCopy region{0, 0, alloc};
    vkCmdCopyBuffer(cb, from->handle(), primary_.handle(), 1, &region);
  } else {
    vkCmdFillBuffer(cb, primary_.handle(), 0, VK_WHOLE_SIZE, 0);
  }
}

absl::StatusOr<std::shared_ptr<TensorInitBatch>> TensorInitBatch::Record(
    std::shared_ptr<Device> device, uint32_t queue_family,
    const std::vector<std::shared_ptr<Tensor>>& tensors) {
  auto batch = std::shared_ptr<TensorInitBatch>(new TensorInitBatch());
  for (const auto& t : tensors) {
    if (t != nullptr && t->init_pending()) batch->tensors_.push_back(t);
  }
  if (batch->tensors_.empty()) return absl::NotFoundError("no tensor awaits its first contents");
  VkDevice dev = device->handle();
  batch->device_ = std::move(device);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pi.queueFamilyIndex = queue_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  KD_RETURN_IF_ERROR(
      batch->device_->Check(vkCreateCommandPool(dev, &pi, nullptr, &pool), "vkCreateCommandPool"));
  batch->pool_ = CommandPoolHandle(dev, pool);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  KD_RETURN_IF_ERROR(batch->device_->Check(vkAllocateCommandBuffers(dev, &ai, &batch->cb_),
                                           "vkAllocateCommandBuffers"));
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  KD_RETURN_IF_ERROR(
      batch->device_->Check(vkBeginCommandBuffer(batch->cb_, &bi), "vkBeginCommandBuffer"));
  for (const auto& t : batch->tensors_) t->RecordInit(batch->cb_);
  // Every later command on the queue sees the contents, whatever it does with them.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
  vkCmdPipelineBarrier(batch->cb_, VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  KD_RETURN_IF_ERROR(batch->device_->Check(vkEndCommandBuffer(batch->cb_), "vkEndCommandBuffer"));
  return batch;
}

TensorInitBatch::~TensorInitBatch() = default;

void TensorInitBatch::Submitted() {
  for (const auto& t : tensors_) {
    t->init_pending_.store(false, std::memory_order_release);
    // The upload buffer lives as long as the batch, which outlives the submission.
    if (t->upload_ != nullptr) uploads_.push_back(std::move(t->upload_));
  }
}

void* Tensor::host_data() const {
  if (memory_ == MemoryType::kStorage) return nullptr;  // even where device memory is mappable
  if (staging_.mapped() != nullptr) return staging_.mapped();
  return primary_.mapped();
}

void Tensor::RecordToDevice(VkCommandBuffer cb) const {
  if (!staging_.handle()) return;
  if (is_image()) {
    const VkBufferImageCopy region = WholeImage(shape_);
    vkCmdCopyBufferToImage(cb, staging_.handle(), image_.handle(), VK_IMAGE_LAYOUT_GENERAL, 1,
                           &region);
    return;
  }
  VkBufferCopy region{0, 0, byte_size()};
  vkCmdCopyBuffer(cb, staging_.handle(), primary_.handle(), 1, &region);
}

void Tensor::RecordToHost(VkCommandBuffer cb) const {
  if (!staging_.handle()) return;
  if (is_image()) {
    const VkBufferImageCopy region = WholeImage(shape_);
    vkCmdCopyImageToBuffer(cb, image_.handle(), VK_IMAGE_LAYOUT_GENERAL, staging_.handle(), 1,
                           &region);
    return;
  }
  VkBufferCopy region{0, 0, byte_size()};
  vkCmdCopyBuffer(cb, primary_.handle(), staging_.handle(), 1, &region);
}

void Tensor::RecordCopyTo(VkCommandBuffer cb, const Tensor& dst) const {
  if (is_image() && dst.is_image()) {
    VkImageCopy region{};
    region.srcSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
    region.dstSubresource = region.srcSubresource;
    region.extent = {shape_.width, shape_.height, 1};
    vkCmdCopyImage(cb, image_.handle(), VK_IMAGE_LAYOUT_GENERAL, dst.image_.handle(),
                   VK_IMAGE_LAYOUT_GENERAL, 1, &region);
    return;
  }
  if (is_image()) {
    const VkBufferImageCopy region = WholeImage(shape_);
    vkCmdCopyImageToBuffer(cb, image_.handle(), VK_IMAGE_LAYOUT_GENERAL, dst.primary_.handle(), 1,
                           &region);
    return;
  }
  if (dst.is_image()) {
    const VkBufferImageCopy region = WholeImage(dst.shape_);
    vkCmdCopyBufferToImage(cb, primary_.handle(), dst.image_.handle(), VK_IMAGE_LAYOUT_GENERAL, 1,
                           &region);
    return;
  }
  VkBufferCopy region{0, 0, byte_size()};
  vkCmdCopyBuffer(cb, primary_.handle(), dst.primary_.handle(), 1, &region);
}

void Tensor::RecordBarrier(VkCommandBuffer cb, VkAccessFlags src_access, VkAccessFlags dst_access,
                           VkPipelineStageFlags src_stage, VkPipelineStageFlags dst_stage,
                           bool primary) const {
  if (is_image() && (primary || !staging_.handle())) {
    ImageBarrier(cb, image_.handle(), VK_IMAGE_LAYOUT_GENERAL, src_access, dst_access, src_stage,
                 dst_stage);
    return;
  }
  VkBufferMemoryBarrier b{VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER};
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  b.srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
  b.dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
  b.buffer = (primary || !staging_.handle()) ? primary_.handle() : staging_.handle();
  b.offset = 0;
  b.size = VK_WHOLE_SIZE;
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 0, nullptr, 1, &b, 0, nullptr);
}

}  // namespace komputed::core
