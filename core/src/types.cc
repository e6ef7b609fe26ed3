#include "komputed/core/types.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace komputed::core {

absl::string_view MemoryTypeName(MemoryType type) {
  switch (type) {
    case MemoryType::kDevice:
      return "device";
    case MemoryType::kHost:
      return "host";
    case MemoryType::kStorage:
      return "storage";
    case MemoryType::kDeviceAndHost:
      return "deviceAndHost";
  }
  return "unknown";
}

absl::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kBool:
      return "bool";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kUInt32:
      return "uint32";
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
    case ElementType::kBytes:
      return "bytes";
    case ElementType::kInt16:
      return "int16";
    case ElementType::kUInt16:
      return "uint16";
    case ElementType::kInt8:
      return "int8";
    case ElementType::kUInt8:
      return "uint8";
    case ElementType::kFloat16:
      return "float16";
  }
  return "unknown";
}

uint32_t ElementTypeSize(ElementType type) {
  switch (type) {
    case ElementType::kBool:
    case ElementType::kInt8:
    case ElementType::kUInt8:
      return 1;
    case ElementType::kInt16:
    case ElementType::kUInt16:
    case ElementType::kFloat16:
      return 2;
    case ElementType::kInt32:
    case ElementType::kUInt32:
    case ElementType::kFloat32:
      return 4;
    case ElementType::kFloat64:
      return 8;
    case ElementType::kBytes:
      return 0;
  }
  return 0;
}

absl::StatusOr<uint32_t> CheckTensorShape(ElementType type, MemoryType memory, uint64_t count,
                                          uint32_t element_size) {
  if (static_cast<uint8_t>(type) > static_cast<uint8_t>(kLastElementType)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown element type ", static_cast<int>(type)));
  }
  if (static_cast<uint8_t>(memory) > static_cast<uint8_t>(kLastMemoryType)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown memory type ", static_cast<int>(memory)));
  }
  const uint32_t natural = ElementTypeSize(type);
  if (type == ElementType::kBytes) {
    if (element_size == 0) {
      return absl::InvalidArgumentError("a tensor of raw bytes needs an element size above 0");
    }
  } else if (element_size != 0 && element_size != natural) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", element_size,
                                                   " does not match ", ElementTypeName(type), " (",
                                                   natural, " bytes; give 0 or ", natural, ")"));
  } else {
    element_size = natural;
  }
  if (count == 0) {
    return absl::InvalidArgumentError("cannot create a zero-sized tensor (0 elements)");
  }
  if (count > std::numeric_limits<uint64_t>::max() / element_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", count, " elements of ", element_size, " bytes overflows"));
  }
  return element_size;
}

int ImageElementIndex(ElementType type) {
  switch (type) {
    case ElementType::kInt8:
      return 0;
    case ElementType::kUInt8:
      return 1;
    case ElementType::kInt16:
      return 2;
    case ElementType::kUInt16:
      return 3;
    case ElementType::kFloat16:
      return 4;
    case ElementType::kInt32:
      return 5;
    case ElementType::kUInt32:
      return 6;
    case ElementType::kFloat32:
      return 7;
    default:
      return -1;
  }
}

absl::Status CheckImageShape(ElementType type, MemoryType memory, const ImageShape& shape) {
  if (static_cast<uint8_t>(type) > static_cast<uint8_t>(kLastElementType)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown element type ", static_cast<int>(type)));
  }
  if (!IsImageElementType(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an image cannot hold ", ElementTypeName(type),
        " elements: images hold int8, uint8, int16, uint16, int32, uint32, float16 or float32"));
  }
  if (shape.channels < 1 || shape.channels > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("an image has 1 to 4 channels, not ", shape.channels));
  }
  if (shape.width == 0 || shape.height == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create an image of ", shape.width, "x",
                                                   shape.height, " texels: both must be above 0"));
  }
  if (memory != MemoryType::kDevice && memory != MemoryType::kStorage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an image of memory type ", MemoryTypeName(memory),
        ": images live in device memory; use device (its host data moved by sync operations) "
        "or storage"));
  }
  return absl::OkStatus();
}

}  // namespace komputed::core
