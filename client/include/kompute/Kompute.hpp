#pragma once
// komputed's Kompute-compatible C++ API (namespace kp). Programs written for Kompute 0.9 compile
// against this header unchanged. Objects run in-process on a local Vulkan device, or remotely on a
// komputed daemon when the environment variable KOMPUTED_ADDRESS names one.
//
// Errors: where Kompute throws, kp throws kp::Error (a std::runtime_error with a status code).
// Threads: every class here may be used from several threads at once; host data returned by
// Tensor::data() is the caller's to synchronise.

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <vulkan/vulkan.hpp>

namespace kp {

// The canonical status codes (google.rpc.Code / absl::StatusCode values).
enum class ErrorCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// What kp throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Number of workgroups per dimension; x = 0 means "the first tensor's size", y or z = 0 mean 1.
using Workgroup = std::array<uint32_t, 3>;
using Constants = std::vector<float>;

namespace internal {
class Backend;
class BackendTensor;
class BackendAlgorithm;
class BackendSequence;
}  // namespace internal

class Manager;
class Sequence;

// Memory and element types (Kompute's later spelling); Tensor repeats them under its own names.
class Memory {
 public:
  enum class MemoryTypes {
    eDevice = 0,         // device memory plus a host staging copy (sync ops move data)
    eHost = 1,           // host-visible memory that shaders read directly
    eStorage = 2,        // device memory only; no host data
    eDeviceAndHost = 3,  // device-local memory that is also host-visible
  };
  // The element types, numbered as Kompute's (eShort to eUnsignedChar as its later versions);
  // eHalf is komputed's own.
  enum class DataTypes {
    eBool = 0,
    eInt = 1,
    eUnsignedInt = 2,
    eFloat = 3,
    eDouble = 4,
    eCustom = 5,         // raw elements of a given size
    eShort = 6,          // int16_t
    eUnsignedShort = 7,  // uint16_t
    eChar = 8,           // int8_t
    eUnsignedChar = 9,   // uint8_t
    eHalf = 10,          // kp::float16: IEEE 754 binary16
  };
  // Which kind of memory object this is.
  enum class Type { eTensor = 0, eImage = 1 };
  virtual ~Memory() = default;
  virtual Type type() const = 0;
};

// An IEEE 754 binary16 ("half") value, held as its 16 bits: the element type of float16
// tensors (DataTypes::eHalf, tensorT<kp::float16>), laid out as shaders' float16_t. It converts
// implicitly from and to float: to float exactly; from float rounded to the nearest half, ties to
// even, beyond 65504 (from 65520 on) to infinity, NaN to a quiet NaN. Arithmetic happens in float.
class float16 {
 public:
  constexpr float16() = default;
  float16(float value) : bits_(fromFloat(value)) {}
  operator float() const { return toFloat(bits_); }
  static constexpr float16 fromBits(uint16_t bits) {
    float16 h;
    h.bits_ = bits;
    return h;
  }
  constexpr uint16_t bits() const { return bits_; }

 private:
  static uint16_t fromFloat(float value) {
    uint32_t x;
    std::memcpy(&x, &value, sizeof(x));
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t exponent = (x >> 23) & 0xFFu;
    const uint32_t mantissa = x & 0x7FFFFFu;
    if (exponent == 0xFFu) {  // infinity, or NaN (kept quiet, with its payload's top bits)
      return static_cast<uint16_t>(sign | 0x7C00u |
                                   (mantissa != 0 ? 0x200u | (mantissa >> 13) : 0u));
    }
    const int e = static_cast<int>(exponent) - 112;  // the half's biased exponent
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
    // A normal half keeps the top 10 fraction bits; a subnormal one (e <= 0) the significand
    // shifted right by 14 - e. Below half of the least subnormal it is zero.
    const int shift = e > 0 ? 13 : 14 - e;
    if (shift > 24) return static_cast<uint16_t>(sign);
    const uint32_t significand = mantissa | (exponent != 0 ? 0x800000u : 0u);
    uint32_t kept =
        e > 0 ? (static_cast<uint32_t>(e) << 10) | (mantissa >> 13) : significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    // Rounding up may carry into the exponent, up to infinity: still the right bits.
    if (rest > halfway || (rest == halfway && (kept & 1u) != 0)) ++kept;
    return static_cast<uint16_t>(sign | kept);
  }
  static float toFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    uint32_t x;
    if (exponent == 0x1F) {
      x = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
      x = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
      x = sign;
    } else {  // subnormal: mantissa × 2^-24, a normal float
      int e = 113;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --e;
      }
      x = sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float value;
    std::memcpy(&value, &x, sizeof(value));
    return value;
  }

  uint16_t bits_ = 0;
};
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

// A typed array on the device with its host copy.
class Tensor : public Memory {
 public:
  using TensorTypes = MemoryTypes;
  using TensorDataTypes = DataTypes;

  ~Tensor() override;
  Type type() const override { return Type::eTensor; }

  // Element count.
  size_t size() const;
  uint32_t dataTypeMemorySize() const { return element_size_; }
  // Bytes: size() * dataTypeMemorySize().
  size_t memorySize() const { return count_ * element_size_; }
  DataTypes dataType() const { return data_type_; }
  MemoryTypes tensorType() const { return memory_type_; }
  MemoryTypes memoryType() const { return memory_type_; }
  bool isInit() const;
  // Frees the device memory once no recorded sequence uses it; the tensor is no longer isInit().
  void destroy();

  // The host copy (nullptr for eStorage). Results of shaders appear here after OpTensorSyncLocal
  // (eDevice) or right after the submission (eHost, eDeviceAndHost).
  void* rawData();
  template <typename T>
  T* data() {
    return static_cast<T*>(rawData());
  }
  template <typename T>
  std::vector<T> vector() {
    const T* p = static_cast<const T*>(hostOrThrow());
    return std::vector<T>(p, p + memorySize() / sizeof(T));
  }
  // Copies memorySize() bytes into the host copy.
  void setRawData(const void* data);

  // komputed internals, for the backends.
  std::shared_ptr<internal::BackendTensor> backendTensor() const;

 protected:
  Tensor(std::shared_ptr<internal::BackendTensor> impl, void* host, uint64_t count,
         uint32_t element_size, DataTypes data_type, MemoryTypes memory_type);
  void* hostOrThrow() const;

 private:
  friend class Manager;
  mutable std::mutex mu_;
  std::shared_ptr<internal::BackendTensor> impl_;
  void* host_;
  uint64_t count_;
  uint32_t element_size_;
  DataTypes data_type_;
  MemoryTypes memory_type_;
};

namespace detail {
template <typename T>
constexpr Memory::DataTypes DataTypeOf() {
  if constexpr (std::is_same_v<T, bool>) return Memory::DataTypes::eBool;
  if constexpr (std::is_same_v<T, int32_t>) return Memory::DataTypes::eInt;
  if constexpr (std::is_same_v<T, uint32_t>) return Memory::DataTypes::eUnsignedInt;
  if constexpr (std::is_same_v<T, float>) return Memory::DataTypes::eFloat;
  if constexpr (std::is_same_v<T, double>) return Memory::DataTypes::eDouble;
  if constexpr (std::is_same_v<T, int16_t>) return Memory::DataTypes::eShort;
  if constexpr (std::is_same_v<T, uint16_t>) return Memory::DataTypes::eUnsignedShort;
  if constexpr (std::is_same_v<T, int8_t>) return Memory::DataTypes::eChar;
  if constexpr (std::is_same_v<T, uint8_t>) return Memory::DataTypes::eUnsignedChar;
  if constexpr (std::is_same_v<T, float16>) return Memory::DataTypes::eHalf;
  return Memory::DataTypes::eCustom;
}

// Bytes of a vector of trivially copyable values (std::vector<bool> included).
template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& values) {
  static_assert(std::is_trivially_copyable_v<T>, "constants must be trivially copyable");
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) bytes[i] = values[i] ? 1 : 0;
  } else if (!values.empty()) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

template <typename T>
std::vector<T> FromBytes(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) values[i] = bytes[i] != 0;
  } else if (!values.empty()) {
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  }
  return values;
}

// Raw description of what an operation does; built by the Op* classes. The values are those of
// komputed's own operation kinds (checked where kp converts them); kMult is kp's alone.
enum class OpKind {
  kSyncDevice = 0,
  kSyncLocal = 1,
  kCopy = 2,
  kDispatch = 3,
  kBarrier = 4,
  kMult = 5
};
}  // namespace detail

namespace detail {
// The typed host-data access of TensorT and ImageT: Base is Tensor or Image.
template <typename T, typename Base>
class Typed : public Base {
 public:
  T* data() { return static_cast<T*>(this->rawData()); }
  std::vector<T> vector() {
    const T* p = static_cast<const T*>(this->hostOrThrow());
    return std::vector<T>(p, p + this->size());
  }
  T& operator[](size_t index) { return data()[index]; }
  // Replaces the host copy; the size must be the same.
  void setData(const std::vector<T>& values) {
    if (values.size() != this->size()) {
      throw Error(ErrorCode::kInvalidArgument, "setData: " + std::to_string(values.size()) +
                                                   " values given for " +
                                                   std::to_string(this->size()) + " elements");
    }
    T* p = static_cast<T*>(this->hostOrThrow());
    if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    } else {
      std::memcpy(p, values.data(), values.size() * sizeof(T));
    }
  }
  Memory::DataTypes dataType() const { return DataTypeOf<T>(); }

 protected:
  using Base::Base;
};
}  // namespace detail

// A tensor of T elements.
template <typename T>
class TensorT : public detail::Typed<T, Tensor> {
 private:
  friend class Manager;
  using detail::Typed<T, Tensor>::Typed;
};

// A 2-D image (Kompute's Image): getY() rows of getX() texels of getNumChannels() elements each
// (1 to 4), row-major and tightly packed in its host data, which sync operations move as a
// tensor's. Images are eDevice (with host data) or eStorage; their elements are int8, uint8,
// int16, uint16, int32, uint32 (formats *_SINT/*_UINT: GLSL r32ui, rgba8i...), float16 or float32
// (*_SFLOAT: r32f, rgba16f...). Shaders bind them as storage images (`uniform image2D`,
// iimage2D, uimage2D, with the image's format qualifier or none); OpCopy copies between images
// of one shape, and between an image and a tensor of its type and element count; OpSyncDevice,
// OpSyncLocal and OpMemoryBarrier take images as they take tensors. An Image is also a Tensor to
// komputed's API, so that every list of tensors takes it.
class Image : public Tensor {
 public:
  Type type() const override { return Type::eImage; }
  uint32_t getX() const { return width_; }
  uint32_t getY() const { return height_; }
  uint32_t getNumChannels() const { return channels_; }

 protected:
  Image(std::shared_ptr<internal::BackendTensor> impl, void* host, uint32_t width, uint32_t height,
        uint32_t channels, uint32_t element_size, DataTypes data_type, MemoryTypes memory_type)
      : Tensor(std::move(impl), host, uint64_t{width} * height * channels, element_size, data_type,
               memory_type),
        width_(width),
        height_(height),
        channels_(channels) {}

 private:
  friend class Manager;
  uint32_t width_;
  uint32_t height_;
  uint32_t channels_;
};

// An image of T elements.
template <typename T>
class ImageT : public detail::Typed<T, Image> {
 private:
  friend class Manager;
  using detail::Typed<T, Image>::Typed;
};

namespace detail {
// A list of Kompute's memory objects as komputed's tensors (every kp Image is a Tensor); throws
// kInvalidArgument for an object that komputed did not make.
std::vector<std::shared_ptr<Tensor>> AsTensors(const std::vector<std::shared_ptr<Memory>>& memory);
template <typename M>
inline constexpr bool kIsMemory = std::is_same_v<M, Memory>;
}  // namespace detail

// A compute shader bound to its tensors, with its workgroup and constants.
class Algorithm {
 public:
  ~Algorithm();

  template <typename S = float, typename P = float>
  void rebuild(const std::vector<std::shared_ptr<Tensor>>& tensors,
               const std::vector<uint32_t>& spirv, const Workgroup& workgroup = {},
               const std::vector<S>& specializationConstants = {},
               const std::vector<P>& pushConstants = {}) {
    rebuildRaw(tensors, spirv, workgroup, detail::ToBytes(specializationConstants), sizeof(S),
               detail::ToBytes(pushConstants));
  }

  // Replaces the push constants used by dispatches recorded from now on; the total size in bytes
  // must not change.
  template <typename T>
  void setPushConstants(const std::vector<T>& pushConstants) {
    setPushConstantBytes(detail::ToBytes(pushConstants));
  }
  void setPushConstants(const void* data, uint32_t size, uint32_t memorySize) {
    const auto* p = static_cast<const uint8_t*>(data);
    setPushConstantBytes(std::vector<uint8_t>(p, p + size_t{size} * memorySize));
  }
  template <typename T>
  std::vector<T> getPushConstants() const {
    return detail::FromBytes<T>(pushConstantBytes());
  }
  template <typename T>
  std::vector<T> getSpecializationConstants() const {
    return detail::FromBytes<T>(specConstantBytes());
  }
  template <typename S = float, typename P = float, typename M,
            typename = std::enable_if_t<detail::kIsMemory<M>>>
  void rebuild(const std::vector<std::shared_ptr<M>>& memory, const std::vector<uint32_t>& spirv,
               const Workgroup& workgroup = {}, const std::vector<S>& specializationConstants = {},
               const std::vector<P>& pushConstants = {}) {
    rebuild<S, P>(detail::AsTensors(memory), spirv, workgroup, specializationConstants,
                  pushConstants);
  }
  Workgroup getWorkgroup() const;
  // Its tensors and images, in binding order (an Image is a Tensor here).
  std::vector<std::shared_ptr<Tensor>> getTensors() const;
  std::vector<std::shared_ptr<Memory>> getMemObjects() const;
  bool isInit() const;
  void destroy();

  // komputed internals.
  void rebuildRaw(const std::vector<std::shared_ptr<Tensor>>& tensors,
                  const std::vector<uint32_t>& spirv, const Workgroup& workgroup,
                  std::vector<uint8_t> spec, uint32_t spec_size, std::vector<uint8_t> push);
  void setPushConstantBytes(std::vector<uint8_t> bytes);
  // The backend's values: those that a dispatch recorded now without an override would use.
  std::vector<uint8_t> pushConstantBytes() const;
  std::vector<uint8_t> specConstantBytes() const;
  std::shared_ptr<internal::BackendAlgorithm> backendAlgorithm() const;

 private:
  friend class Manager;
  explicit Algorithm(std::shared_ptr<internal::Backend> backend);

  mutable std::mutex mu_;
  std::shared_ptr<internal::Backend> backend_;
  std::shared_ptr<internal::BackendAlgorithm> impl_;
  bool destroyed_ = false;
  std::vector<std::shared_ptr<Tensor>> tensors_;
  Workgroup workgroup_{};
  std::vector<uint8_t> spec_;
  uint32_t spec_size_ = 0;
};

// Base of the operations a sequence records. Operations are descriptions: the backend records
// them (in-process into a Vulkan command buffer, remotely on the daemon).
class OpBase {
 public:
  virtual ~OpBase() = default;

  // komputed internals.
  detail::OpKind kind() const { return kind_; }
  const std::vector<std::shared_ptr<Tensor>>& tensors() const { return tensors_; }
  const std::shared_ptr<Algorithm>& algorithm() const { return algorithm_; }
  const std::optional<std::vector<uint8_t>>& pushConstants() const { return push_; }
  struct Barrier {
    uint32_t src_access = 0, dst_access = 0, src_stage = 0, dst_stage = 0;
    bool primary = true;
  };
  const Barrier& barrier() const { return barrier_; }

 protected:
  OpBase(detail::OpKind kind, std::vector<std::shared_ptr<Tensor>> tensors)
      : kind_(kind), tensors_(std::move(tensors)) {}

  detail::OpKind kind_;
  std::vector<std::shared_ptr<Tensor>> tensors_;
  std::shared_ptr<Algorithm> algorithm_;
  std::optional<std::vector<uint8_t>> push_;
  Barrier barrier_;
};

// Host copy → device, for eDevice tensors (others need no sync).
class OpTensorSyncDevice : public OpBase {
 public:
  explicit OpTensorSyncDevice(const std::vector<std::shared_ptr<Tensor>>& tensors)
      : OpBase(detail::OpKind::kSyncDevice, tensors) {}
  template <typename M, typename = std::enable_if_t<detail::kIsMemory<M>>>
  explicit OpTensorSyncDevice(const std::vector<std::shared_ptr<M>>& memory)
      : OpBase(detail::OpKind::kSyncDevice, detail::AsTensors(memory)) {}
};

// Device → host copy, for eDevice tensors.
class OpTensorSyncLocal : public OpBase {
 public:
  explicit OpTensorSyncLocal(const std::vector<std::shared_ptr<Tensor>>& tensors)
      : OpBase(detail::OpKind::kSyncLocal, tensors) {}
  template <typename M, typename = std::enable_if_t<detail::kIsMemory<M>>>
  explicit OpTensorSyncLocal(const std::vector<std::shared_ptr<M>>& memory)
      : OpBase(detail::OpKind::kSyncLocal, detail::AsTensors(memory)) {}
};

// tensors[0] → every other tensor (same type and size), on the device and in host copies.
class OpTensorCopy : public OpBase {
 public:
  explicit OpTensorCopy(const std::vector<std::shared_ptr<Tensor>>& tensors)
      : OpBase(detail::OpKind::kCopy, tensors) {}
  template <typename M, typename = std::enable_if_t<detail::kIsMemory<M>>>
  explicit OpTensorCopy(const std::vector<std::shared_ptr<M>>& memory)
      : OpBase(detail::OpKind::kCopy, detail::AsTensors(memory)) {}
};

// Dispatches an algorithm; push constants, when given, replace the algorithm's (and stay).
class OpAlgoDispatch : public OpBase {
 public:
  template <typename T = float>
  explicit OpAlgoDispatch(const std::shared_ptr<Algorithm>& algorithm,
                          const std::vector<T>& pushConstants = {})
      : OpBase(detail::OpKind::kDispatch, {}) {
    algorithm_ = algorithm;
    if (!pushConstants.empty()) {
      push_ = detail::ToBytes(pushConstants);
    }
  }
};

// Element-wise a × b → c over three tensors of one type, with a built-in shader; fills in the
// (usually empty) algorithm it is given.
class OpMult : public OpBase {
 public:
  OpMult(const std::vector<std::shared_ptr<Tensor>>& tensors,
         const std::shared_ptr<Algorithm>& algorithm)
      : OpBase(detail::OpKind::kMult, tensors) {
    algorithm_ = algorithm;
  }
  template <typename M, typename = std::enable_if_t<detail::kIsMemory<M>>>
  OpMult(const std::vector<std::shared_ptr<M>>& memory, const std::shared_ptr<Algorithm>& algorithm)
      : OpMult(detail::AsTensors(memory), algorithm) {}
};

// A buffer memory barrier on each tensor (its primary buffer, or its staging buffer).
class OpMemoryBarrier : public OpBase {
 public:
  template <typename M, typename = std::enable_if_t<detail::kIsMemory<M>>>
  OpMemoryBarrier(const std::vector<std::shared_ptr<M>>& memory,
                  const vk::AccessFlags& srcAccessMask, const vk::AccessFlags& dstAccessMask,
                  const vk::PipelineStageFlags& srcStageMask,
                  const vk::PipelineStageFlags& dstStageMask, bool barrierOnPrimary = true)
      : OpMemoryBarrier(detail::AsTensors(memory), srcAccessMask, dstAccessMask, srcStageMask,
                        dstStageMask, barrierOnPrimary) {}
  OpMemoryBarrier(const std::vector<std::shared_ptr<Tensor>>& tensors,
                  const vk::AccessFlags& srcAccessMask, const vk::AccessFlags& dstAccessMask,
                  const vk::PipelineStageFlags& srcStageMask,
                  const vk::PipelineStageFlags& dstStageMask, bool barrierOnPrimary = true)
      : OpBase(detail::OpKind::kBarrier, tensors) {
    barrier_.src_access = static_cast<uint32_t>(srcAccessMask);
    barrier_.dst_access = static_cast<uint32_t>(dstAccessMask);
    barrier_.src_stage = static_cast<uint32_t>(srcStageMask);
    barrier_.dst_stage = static_cast<uint32_t>(dstStageMask);
    barrier_.primary = barrierOnPrimary;
  }
};

// Later Kompute names.
using OpSyncDevice = OpTensorSyncDevice;
using OpSyncLocal = OpTensorSyncLocal;
using OpCopy = OpTensorCopy;

// Recorded operations on one queue. record() appends; eval() submits and waits; after an eval,
// the next record() starts a new batch; eval() without recording re-runs the last batch.
class Sequence : public std::enable_shared_from_this<Sequence> {
 public:
  // Releases the sequence without waiting for a submission in flight on a remote daemon (whose
  // results are then dropped; the daemon finishes it and frees it). destroy() waits instead.
  ~Sequence();

  std::shared_ptr<Sequence> record(std::shared_ptr<OpBase> op);
  // Creates the operation T from a tensor list (or an algorithm) and further arguments.
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> record(std::vector<std::shared_ptr<Tensor>> tensors,
                                   TArgs&&... params) {
    return record(std::shared_ptr<OpBase>(new T(tensors, std::forward<TArgs>(params)...)));
  }
  // The same from a list of Kompute's memory objects (tensors and images).
  template <typename T, typename M, typename... TArgs,
            typename = std::enable_if_t<detail::kIsMemory<M>>>
  std::shared_ptr<Sequence> record(const std::vector<std::shared_ptr<M>>& memory,
                                   TArgs&&... params) {
    return record<T>(detail::AsTensors(memory), std::forward<TArgs>(params)...);
  }
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> record(std::shared_ptr<Algorithm> algorithm, TArgs&&... params) {
    return record(std::shared_ptr<OpBase>(new T(algorithm, std::forward<TArgs>(params)...)));
  }

  // Submits and waits (bounded by KOMPUTED_EVAL_TIMEOUT_S, default 600 s).
  std::shared_ptr<Sequence> eval();
  // Clears, records `op`, evaluates.
  std::shared_ptr<Sequence> eval(std::shared_ptr<OpBase> op);
  // Creates the operation T from a tensor list (or an algorithm) and further arguments.
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> eval(std::vector<std::shared_ptr<Tensor>> tensors, TArgs&&... params) {
    return eval(std::shared_ptr<OpBase>(new T(tensors, std::forward<TArgs>(params)...)));
  }
  template <typename T, typename M, typename... TArgs,
            typename = std::enable_if_t<detail::kIsMemory<M>>>
  std::shared_ptr<Sequence> eval(const std::vector<std::shared_ptr<M>>& memory, TArgs&&... params) {
    return eval<T>(detail::AsTensors(memory), std::forward<TArgs>(params)...);
  }
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> eval(std::shared_ptr<Algorithm> algorithm, TArgs&&... params) {
    return eval(std::shared_ptr<OpBase>(new T(algorithm, std::forward<TArgs>(params)...)));
  }

  std::shared_ptr<Sequence> evalAsync();
  std::shared_ptr<Sequence> evalAsync(std::shared_ptr<OpBase> op);
  // Creates the operation T from a tensor list (or an algorithm) and further arguments.
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> evalAsync(std::vector<std::shared_ptr<Tensor>> tensors,
                                      TArgs&&... params) {
    return evalAsync(std::shared_ptr<OpBase>(new T(tensors, std::forward<TArgs>(params)...)));
  }
  template <typename T, typename M, typename... TArgs,
            typename = std::enable_if_t<detail::kIsMemory<M>>>
  std::shared_ptr<Sequence> evalAsync(const std::vector<std::shared_ptr<M>>& memory,
                                      TArgs&&... params) {
    return evalAsync<T>(detail::AsTensors(memory), std::forward<TArgs>(params)...);
  }
  template <typename T, typename... TArgs>
  std::shared_ptr<Sequence> evalAsync(std::shared_ptr<Algorithm> algorithm, TArgs&&... params) {
    return evalAsync(std::shared_ptr<OpBase>(new T(algorithm, std::forward<TArgs>(params)...)));
  }
  // Waits up to waitFor nanoseconds for an evalAsync, then runs the operations' host steps. As in
  // Kompute, running out of time is no error: a warning is logged and the sequence is returned
  // still running (isRunning()), so that a later evalAwait finishes it; evalAwaitFor tells the
  // two apart. UINT64_MAX (Kompute's "forever") waits up to the eval timeout
  // (KOMPUTED_EVAL_TIMEOUT_S) and throws kDeadlineExceeded past it, the sequence still running.
  // Returns at once when nothing is in flight.
  std::shared_ptr<Sequence> evalAwait(uint64_t waitFor = UINT64_MAX);
  // evalAwait that reports the outcome: true when nothing is in flight any more (the submission
  // completed and its host steps ran, or there was none), false when still running after waitFor
  // nanoseconds (UINT64_MAX: the eval timeout).
  bool evalAwaitFor(uint64_t waitFor);

  // Drops the recorded operations (their host steps) and ends the recording. As in Kompute 0.9,
  // the commands already recorded stay: eval()/evalAsync() still run them, without host steps,
  // until the next record() begins anew. Throws kFailedPrecondition while running.
  void clear();
  // Kompute's explicit bracket of recording: record() begins by itself; end() closes the
  // recording (the next record() begins a new batch). Both throw kFailedPrecondition while
  // running.
  void begin();
  void end();
  // Between the first record() of a batch and its end() (or eval, evalAsync, clear).
  bool isRecording() const;
  // From evalAsync() until an evalAwait() has seen it complete.
  bool isRunning() const;
  bool isInit() const;
  // Records every operation recorded since the last clear() again (after Algorithm::rebuild).
  void rerecord();
  // Nanoseconds: one value before the first operation and one after each (last eval).
  std::vector<std::uint64_t> getTimestamps();
  // Waits for a submission in flight (bounded by the eval timeout; its results arrive), then
  // releases the sequence; it is no longer isInit().
  void destroy();

 private:
  friend class Manager;
  explicit Sequence(std::shared_ptr<internal::BackendSequence> impl);
  internal::BackendSequence& implOrThrow() const;
  void recordLocked(const OpBase& op);

  mutable std::mutex mu_;
  std::shared_ptr<internal::BackendSequence> impl_;
};

// A physical device as listed by Manager::listDevices(): its properties, and its Vulkan handle
// where the device is in this process (a null handle for a remote Manager's).
class PhysicalDevice {
 public:
  explicit PhysicalDevice(const vk::PhysicalDeviceProperties& properties,
                          vk::PhysicalDevice handle = {})
      : properties_(properties), handle_(handle) {}
  vk::PhysicalDeviceProperties getProperties() const { return properties_; }
  vk::PhysicalDevice handle() const { return handle_; }

 private:
  vk::PhysicalDeviceProperties properties_;
  vk::PhysicalDevice handle_;
};

// What Manager::listDevices() returns: a std::vector<kp::PhysicalDevice>, which also converts to
// the std::vector<vk::PhysicalDevice> that Kompute returns, so that
// `const std::vector<vk::PhysicalDevice> devices = mgr.listDevices();` compiles. In-process those
// are the Vulkan instance's handles, valid until the process exits. A remote Manager has no
// Vulkan handles of the daemon's devices: the conversion throws kp::Error (kUnimplemented);
// read the list as std::vector<kp::PhysicalDevice> (getProperties()) instead.
class DeviceList : public std::vector<PhysicalDevice> {
 public:
  using std::vector<PhysicalDevice>::vector;
  operator std::vector<vk::PhysicalDevice>() const {
    std::vector<vk::PhysicalDevice> handles;
    handles.reserve(size());
    for (const PhysicalDevice& d : *this) {
      if (!d.handle()) {
        throw Error(ErrorCode::kUnimplemented,
                    "listDevices(): a remote Manager has no Vulkan handles of the daemon's "
                    "devices; read the list as std::vector<kp::PhysicalDevice> (getProperties()), "
                    "or use getDeviceProperties()");
      }
      handles.push_back(d.handle());
    }
    return handles;
  }
};

// Where a remote Manager runs: a komputed daemon (or several, of which one is chosen), one of its
// devices, the queues to take, and how the client proves who it is. Each credential left empty
// falls back to its environment variable, which is all that Manager() (through KOMPUTED_ADDRESS)
// and Manager(address) use. Credentials that cannot be read (a missing file, a certificate
// without its key) make the constructor throw kp::Error naming the setting and the file; the
// token is never in a message.
//
// An address that names several daemons (a gRPC target resolving to many addresses:
// "dns:///komputed-headless.NS.svc:50051", "ipv4:10.0.0.5:50051,10.0.0.6:50051") is resolved by
// the client, each daemon is asked for its devices (within $KOMPUTED_PLACEMENT_TIMEOUT_S seconds,
// default 2), and the session opens directly on the daemon whose device has the most free memory
// (then the fewest sessions; lost devices and daemons that do not answer are skipped). When no
// device qualifies, the constructor throws kp::Error with kUnavailable (a daemon did not answer,
// or the device is lost: try again) or kNotFound (nothing matches), naming every daemon and why.
struct Remote {
  // A gRPC target: host:port, unix:PATH, or one naming several daemons (above).
  std::string address;
  // The daemon's device index. Unset: device 0 when `address` names one daemon (and `select`
  // has no name term); with several daemons, the emptiest device of any of them. Set with
  // several daemons: that index on whichever daemon is chosen.
  std::optional<uint32_t> deviceIndex;
  std::vector<uint32_t> familyQueueIndices;  // as Manager(deviceIndex, familyQueueIndices)
  // The bearer token itself (sent as `authorization: Bearer <token>` on every call); else
  // $KOMPUTED_TOKEN, else the contents of the file $KOMPUTED_TOKEN_FILE (trailing whitespace
  // trimmed). None: no token is sent.
  std::string token;
  // PEM file of the CA that signed the daemon's certificate; else $KOMPUTED_TLS_CA. Set, the
  // connection uses TLS; unset, plain text.
  std::string tlsCa;
  // PEM files of a client certificate and its private key, for daemons that require one (mTLS);
  // else $KOMPUTED_TLS_CERT and $KOMPUTED_TLS_KEY. Both or neither; they need tlsCa.
  std::string tlsCert;
  std::string tlsKey;
  // Which devices may be chosen, comma-separated conditions that must all hold, else
  // $KOMPUTED_SELECT: `name~TEXT` (the device's name contains TEXT, case-insensitively),
  // `name=TEXT` (is TEXT), `node=HOST` (the daemon's IP address, or the host the address names),
  // `address=HOST:PORT` (the daemon); `~` works on node and address too. A malformed selector
  // throws kp::Error with kInvalidArgument.
  std::string select;
};

// Creates and owns tensors, algorithms and sequences on one device.
class Manager {
 public:
  // Device 0 (discrete GPUs first), one queue of the first compute family. Remote when
  // KOMPUTED_ADDRESS is set, with the credentials and KOMPUTED_SELECT of the environment (see
  // Remote): on the daemon's device 0, or, when the address names several daemons, on the device
  // with the most free memory among them. KOMPUTED_DEVICE=N picks device N instead (the daemon's
  // device index when remote; of several daemons, device N of the one chosen), and
  // KOMPUTED_DEVICE=HOST:PORT/N device N of that daemon, so that one program runs on any GPU.
  Manager();
  // familyQueueIndices: one entry per queue (sequence(i) uses entry i); repeated entries of a
  // family take its queues 0, 1, 2... Extensions the device lacks are skipped.
  explicit Manager(uint32_t physicalDeviceIndex,
                   const std::vector<uint32_t>& familyQueueIndices = {},
                   const std::vector<std::string>& desiredExtensions = {});
  // Remote on the komputed daemon at `address` (host:port; or several daemons, see Remote),
  // whatever KOMPUTED_ADDRESS says; device 0 of a single daemon; credentials and selector from
  // the environment (see Remote).
  explicit Manager(const std::string& address);
  // Remote, with a device index and queue families (as the local constructor's).
  explicit Manager(const Remote& remote);
  // destroy().
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  std::shared_ptr<Sequence> sequence(uint32_t queueIndex = 0, uint32_t totalTimestamps = 0);

  template <typename T>
  std::shared_ptr<TensorT<T>> tensorT(
      const std::vector<T>& data, Tensor::TensorTypes tensorType = Tensor::TensorTypes::eDevice) {
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> bytes = detail::ToBytes(data);  // std::vector<bool> is packed
      return makeTensorT<T>(bytes.data(), data.size(), tensorType);
    } else {
      return makeTensorT<T>(data.data(), data.size(), tensorType);
    }
  }
  // A tensor of `size` elements, zero-filled.
  template <typename T>
  std::shared_ptr<TensorT<T>> tensorT(
      size_t size, Tensor::TensorTypes tensorType = Tensor::TensorTypes::eDevice) {
    return makeTensorT<T>(nullptr, size, tensorType);
  }
  std::shared_ptr<TensorT<float>> tensor(
      const std::vector<float>& data,
      Tensor::TensorTypes tensorType = Tensor::TensorTypes::eDevice) {
    return tensorT<float>(data, tensorType);
  }
  // elementTotalCount elements of elementMemorySize bytes from `data` (nullptr: zero-filled).
  std::shared_ptr<Tensor> tensor(void* data, uint64_t elementTotalCount, uint32_t elementMemorySize,
                                 const Tensor::TensorDataTypes& dataType,
                                 Tensor::TensorTypes tensorType = Tensor::TensorTypes::eDevice) {
    auto [impl, host] =
        createTensor(data, elementTotalCount, elementMemorySize, dataType, tensorType);
    std::shared_ptr<Tensor> t(new Tensor(std::move(impl), host, elementTotalCount,
                                         elementMemorySize, dataType, tensorType));
    track(t);
    return t;
  }

  template <typename S = float, typename P = float>
  std::shared_ptr<Algorithm> algorithm(const std::vector<std::shared_ptr<Tensor>>& tensors = {},
                                       const std::vector<uint32_t>& spirv = {},
                                       const Workgroup& workgroup = {},
                                       const std::vector<S>& specializationConstants = {},
                                       const std::vector<P>& pushConstants = {}) {
    std::shared_ptr<Algorithm> algo = makeAlgorithm();
    if (!tensors.empty() || !spirv.empty()) {
      algo->rebuild<S, P>(tensors, spirv, workgroup, specializationConstants, pushConstants);
    }
    return algo;
  }

  // The same from a list of Kompute's memory objects (tensors and images, in binding order).
  template <typename S = float, typename P = float, typename M,
            typename = std::enable_if_t<detail::kIsMemory<M>>>
  std::shared_ptr<Algorithm> algorithm(const std::vector<std::shared_ptr<M>>& memory,
                                       const std::vector<uint32_t>& spirv = {},
                                       const Workgroup& workgroup = {},
                                       const std::vector<S>& specializationConstants = {},
                                       const std::vector<P>& pushConstants = {}) {
    return algorithm<S, P>(detail::AsTensors(memory), spirv, workgroup, specializationConstants,
                           pushConstants);
  }

  // 2-D images (see Image): width x height texels of numChannels T values, from `data`
  // (width * height * numChannels values, row-major) or zero-filled. The tiling argument of
  // Kompute's overloads is accepted and ignored: images are optimally tiled device memory, and
  // imageType eHost or eDeviceAndHost throws kInvalidArgument.
  template <typename T>
  std::shared_ptr<ImageT<T>> imageT(const std::vector<T>& data, uint32_t width, uint32_t height,
                                    uint32_t numChannels,
                                    Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return makeImageT<T>(data.data(), data.size(), width, height, numChannels, imageType);
  }
  template <typename T>
  std::shared_ptr<ImageT<T>> imageT(const std::vector<T>& data, uint32_t width, uint32_t height,
                                    uint32_t numChannels, vk::ImageTiling /*tiling*/,
                                    Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<T>(data, width, height, numChannels, imageType);
  }
  template <typename T>
  std::shared_ptr<ImageT<T>> imageT(uint32_t width, uint32_t height, uint32_t numChannels,
                                    Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return makeImageT<T>(nullptr, 0, width, height, numChannels, imageType);
  }
  template <typename T>
  std::shared_ptr<ImageT<T>> imageT(uint32_t width, uint32_t height, uint32_t numChannels,
                                    vk::ImageTiling /*tiling*/,
                                    Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<T>(width, height, numChannels, imageType);
  }
  std::shared_ptr<ImageT<float>> image(
      const std::vector<float>& data, uint32_t width, uint32_t height, uint32_t numChannels,
      Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<float>(data, width, height, numChannels, imageType);
  }
  std::shared_ptr<ImageT<float>> image(
      const std::vector<float>& data, uint32_t width, uint32_t height, uint32_t numChannels,
      vk::ImageTiling tiling, Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<float>(data, width, height, numChannels, tiling, imageType);
  }
  std::shared_ptr<ImageT<float>> image(
      uint32_t width, uint32_t height, uint32_t numChannels,
      Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<float>(width, height, numChannels, imageType);
  }
  std::shared_ptr<ImageT<float>> image(
      uint32_t width, uint32_t height, uint32_t numChannels, vk::ImageTiling tiling,
      Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return imageT<float>(width, height, numChannels, tiling, imageType);
  }
  // dataSize: the number of elements at `data` (width * height * numChannels; nullptr and 0:
  // zero-filled).
  std::shared_ptr<Image> image(void* data, size_t dataSize, uint32_t width, uint32_t height,
                               uint32_t numChannels, const Memory::DataTypes& dataType,
                               Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice);
  std::shared_ptr<Image> image(void* data, size_t dataSize, uint32_t width, uint32_t height,
                               uint32_t numChannels, const Memory::DataTypes& dataType,
                               vk::ImageTiling /*tiling*/,
                               Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return image(data, dataSize, width, height, numChannels, dataType, imageType);
  }
  std::shared_ptr<Image> image(uint32_t width, uint32_t height, uint32_t numChannels,
                               const Memory::DataTypes& dataType,
                               Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return image(nullptr, 0, width, height, numChannels, dataType, imageType);
  }
  std::shared_ptr<Image> image(uint32_t width, uint32_t height, uint32_t numChannels,
                               const Memory::DataTypes& dataType, vk::ImageTiling /*tiling*/,
                               Memory::MemoryTypes imageType = Memory::MemoryTypes::eDevice) {
    return image(nullptr, 0, width, height, numChannels, dataType, imageType);
  }

  // Destroys every sequence, algorithm and tensor made here (they stop being isInit()), then
  // releases the device: a remote Manager closes its session on the daemon, waiting at most
  // KOMPUTED_CLOSE_TIMEOUT_S seconds (default 5) for the daemon's answer. Idempotent.
  void destroy();
  // Forgets objects that were already released elsewhere.
  void clear();

  vk::PhysicalDeviceProperties getDeviceProperties() const;
  // Every device of the machine that runs the work (this one, or the daemon's); see DeviceList.
  DeviceList listDevices() const;

  // komputed internals.
  const std::shared_ptr<internal::Backend>& backend() const;

 private:
  template <typename T>
  std::shared_ptr<TensorT<T>> makeTensorT(const void* data, uint64_t count,
                                          Tensor::TensorTypes type) {
    auto [impl, host] = createTensor(data, count, sizeof(T), detail::DataTypeOf<T>(), type);
    std::shared_ptr<TensorT<T>> t(
        new TensorT<T>(std::move(impl), host, count, sizeof(T), detail::DataTypeOf<T>(), type));
    track(t);
    return t;
  }
  template <typename T>
  std::shared_ptr<ImageT<T>> makeImageT(const void* data, size_t values, uint32_t width,
                                        uint32_t height, uint32_t channels,
                                        Memory::MemoryTypes type) {
    static_assert(!std::is_same_v<T, bool> && !std::is_same_v<T, double>,
                  "images hold 8-, 16- and 32-bit integers, float16 and float32");
    checkImageData(data, values, width, height, channels);
    auto [impl, host] = createTensor(data, uint64_t{width} * height * channels, sizeof(T),
                                     detail::DataTypeOf<T>(), type, width, height, channels);
    std::shared_ptr<ImageT<T>> image(new ImageT<T>(std::move(impl), host, width, height, channels,
                                                   sizeof(T), detail::DataTypeOf<T>(), type));
    track(image);
    return image;
  }
  // Throws kInvalidArgument unless `values` (with data) is width * height * channels.
  static void checkImageData(const void* data, size_t values, uint32_t width, uint32_t height,
                             uint32_t channels);
  // Creates the backend's tensor (an image when channels > 0); returns it with its host data
  // (nullptr for eStorage).
  std::pair<std::shared_ptr<internal::BackendTensor>, void*> createTensor(
      const void* data, uint64_t count, uint32_t element_size, Tensor::TensorDataTypes data_type,
      Tensor::TensorTypes memory_type, uint32_t width = 0, uint32_t height = 0,
      uint32_t channels = 0);
  void track(const std::shared_ptr<Tensor>& tensor);
  std::shared_ptr<Algorithm> makeAlgorithm();
  internal::Backend& backendOrThrow() const;

  mutable std::mutex mu_;
  std::shared_ptr<internal::Backend> backend_;
  std::vector<std::weak_ptr<Tensor>> tensors_;
  std::vector<std::weak_ptr<Algorithm>> algorithms_;
  std::vector<std::weak_ptr<Sequence>> sequences_;
};

// Compiles a GLSL compute shader to SPIR-V; throws kp::Error (kInvalidArgument) with the
// compiler's messages. In-process with shaderc, or, when KOMPUTED_ADDRESS names a daemon, by that
// daemon (with the environment's credentials), so that a client needs no compiler of its own.
std::vector<uint32_t> compileSource(const std::string& source);

}  // namespace kp
