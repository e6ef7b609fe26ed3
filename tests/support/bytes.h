#pragma once
// Tensor data as the wire carries it: the elements' bytes in host order, back to back.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace komputed::test_support {

inline std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

inline std::string UintBytes(const std::vector<uint32_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(uint32_t));
}

inline std::vector<uint32_t> Uints(const std::string& bytes) {
  std::vector<uint32_t> values(bytes.size() / sizeof(uint32_t));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(uint32_t));
  return values;
}

}  // namespace komputed::test_support
