#pragma once
// The element and memory types of tensors: plain values, free of Vulkan and of the wire, shared
// by the core, the kp library, the daemon and the wire converter (which keeps the wire's numbering
// in step with these at compile time).

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace komputed::core {

// Where a tensor's memory lives.
enum class MemoryType : uint8_t {
  kDevice = 0,         // device-local buffer, plus a host-visible staging buffer for its host data
  kHost = 1,           // one host-visible buffer: shaders read the host data directly
  kStorage = 2,        // device-local only; no host data
  kDeviceAndHost = 3,  // one buffer both device-local and host-visible
};
inline constexpr MemoryType kLastMemoryType = MemoryType::kDeviceAndHost;

// The values follow Kompute's Memory::DataTypes (eShort = 6 ... eUnsignedChar = 9); kFloat16 is
// komputed's own.
enum class ElementType : uint8_t {
  kBool = 0,  // 1 byte
  kInt32 = 1,
  kUInt32 = 2,
  kFloat32 = 3,
  kFloat64 = 4,
  kBytes = 5,  // raw elements of a size given at creation
  kInt16 = 6,
  kUInt16 = 7,
  kInt8 = 8,
  kUInt8 = 9,
  kFloat16 = 10,  // IEEE 754 binary16 ("half"), little-endian
};
inline constexpr ElementType kLastElementType = ElementType::kFloat16;

absl::string_view MemoryTypeName(MemoryType type);
absl::string_view ElementTypeName(ElementType type);
// Bytes per element; 0 for kBytes (its size is given at creation).
uint32_t ElementTypeSize(ElementType type);

// Whether a tensor of this memory type has host data (everything but kStorage).
constexpr bool HasHostData(MemoryType m) { return m != MemoryType::kStorage; }
// Whether its host data is a separate staging copy that sync operations move (kDevice).
constexpr bool HasStaging(MemoryType m) { return m == MemoryType::kDevice; }
// Whether its host data is the memory that shaders use (kHost, kDeviceAndHost).
constexpr bool IsHostCoherent(MemoryType m) {
  return m == MemoryType::kHost || m == MemoryType::kDeviceAndHost;
}

// A 2-D image's shape (Kompute's Image): height rows of width texels, each of `channels` elements
// (1 to 4), row-major and tightly packed in its host data. A tensor with an image shape keeps its
// device memory in a VkImage (a storage image to shaders) instead of a buffer; its element count
// is width * height * channels.
struct ImageShape {
  uint32_t width = 0;
  uint32_t height = 0;
  uint32_t channels = 0;
  bool is_image() const { return channels != 0; }
  uint64_t count() const { return uint64_t{width} * height * channels; }
  bool operator==(const ImageShape& o) const {
    return width == o.width && height == o.height && channels == o.channels;
  }
};
// The element types an image may have: the 8-, 16- and 32-bit integers, float16 and float32.
// ImageElementIndex numbers them 0..7 (int8, uint8, int16, uint16, float16, int32, uint32,
// float32), the rows of the tables of image formats; -1 for any other type.
int ImageElementIndex(ElementType type);
inline bool IsImageElementType(ElementType type) { return ImageElementIndex(type) >= 0; }
// The one check of an image's shape, element type and memory type, shared by every backend:
// INVALID_ARGUMENT naming what is wrong. Images live in device memory: kDevice (host data in a
// staging buffer, moved by sync operations) or kStorage.
absl::Status CheckImageShape(ElementType type, MemoryType memory, const ImageShape& shape);

// The shape of a tensor as requested: the one check of element type, memory type, element size
// and count, shared by every backend. `element_size` 0 means the type's natural size (required
// above 0 for kBytes). Returns the element size to use. INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<uint32_t> CheckTensorShape(ElementType type, MemoryType memory, uint64_t count,
                                          uint32_t element_size);

}  // namespace komputed::core
