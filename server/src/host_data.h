#pragma once

#include <cstdint>

#include "komputed/core/tensor.h"
#include "komputed/core/types.h"

namespace komputed::server {

// A tensor's host data, or nullptr when its memory type has none (core::HasHostData). A storage
// tensor never has any, even where the driver gives device-local memory that is host-visible
// (lavapipe), and core maps it.
inline char* HostData(const core::Tensor& tensor) {
  if (!core::HasHostData(tensor.memory_type())) return nullptr;
  return static_cast<char*>(tensor.host_data());
}

// [offset, offset + length) lies inside [0, size).
inline bool Inside(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace komputed::server
