// Tests of Tensor (and Buffer underneath): types, sizes, initial contents, errors.

#include "komputed/core/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr ElementType kElementTypes[] = {
    ElementType::kBool,    ElementType::kInt32, ElementType::kUInt32, ElementType::kFloat32,
    ElementType::kFloat64, ElementType::kBytes, ElementType::kInt16,  ElementType::kUInt16,
    ElementType::kInt8,    ElementType::kUInt8, ElementType::kFloat16};
constexpr MemoryType kMemoryTypes[] = {MemoryType::kDevice, MemoryType::kHost, MemoryType::kStorage,
                                       MemoryType::kDeviceAndHost};

// A byte pattern without zeros, so that a zero-filled tensor cannot pass for it.
std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed = 1) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(seed + i * 7) | 0x01;
  return data;
}

// The device contents of `t`, copied into a new host tensor with one-off commands on `device`
// (t's device).
absl::StatusOr<std::vector<uint8_t>> ReadBack(const Tensor& t,
                                              std::shared_ptr<Device> device = TestDevice()) {
  absl::StatusOr<std::shared_ptr<Tensor>> host = Tensor::Create(
      device, t.element_type(), t.count(),
      t.element_type() == ElementType::kBytes ? t.element_size() : 0, MemoryType::kHost, nullptr);
  if (!host.ok()) return host.status();
  absl::Status s = device->RunOnce([&](VkCommandBuffer cb) {
    t.RecordBarrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, true);
    t.RecordCopyTo(cb, **host);
    (*host)->RecordBarrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT,
                           VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, true);
  });
  if (!s.ok()) return s;
  const auto* p = static_cast<const uint8_t*>((*host)->host_data());
  return std::vector<uint8_t>(p, p + t.byte_size());
}

std::vector<uint8_t> HostBytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.host_data());
  if (p == nullptr) return {};
  return std::vector<uint8_t>(p, p + t.byte_size());
}

TEST(Tensor, Names) {
  EXPECT_EQ(MemoryTypeName(MemoryType::kDevice), "device");
  EXPECT_EQ(MemoryTypeName(MemoryType::kHost), "host");
  EXPECT_EQ(MemoryTypeName(MemoryType::kStorage), "storage");
  EXPECT_EQ(MemoryTypeName(MemoryType::kDeviceAndHost), "deviceAndHost");
  EXPECT_EQ(ElementTypeName(ElementType::kBool), "bool");
  EXPECT_EQ(ElementTypeName(ElementType::kInt32), "int32");
  EXPECT_EQ(ElementTypeName(ElementType::kUInt32), "uint32");
  EXPECT_EQ(ElementTypeName(ElementType::kFloat32), "float32");
  EXPECT_EQ(ElementTypeName(ElementType::kFloat64), "float64");
  EXPECT_EQ(ElementTypeName(ElementType::kBytes), "bytes");
  EXPECT_EQ(ElementTypeName(ElementType::kInt16), "int16");
  EXPECT_EQ(ElementTypeName(ElementType::kUInt16), "uint16");
  EXPECT_EQ(ElementTypeName(ElementType::kInt8), "int8");
  EXPECT_EQ(ElementTypeName(ElementType::kUInt8), "uint8");
  EXPECT_EQ(ElementTypeName(ElementType::kFloat16), "float16");
  EXPECT_EQ(ElementTypeName(static_cast<ElementType>(11)), "unknown");
  EXPECT_EQ(ElementTypeSize(ElementType::kBool), 1u);
  EXPECT_EQ(ElementTypeSize(ElementType::kInt32), 4u);
  EXPECT_EQ(ElementTypeSize(ElementType::kUInt32), 4u);
  EXPECT_EQ(ElementTypeSize(ElementType::kFloat32), 4u);
  EXPECT_EQ(ElementTypeSize(ElementType::kFloat64), 8u);
  EXPECT_EQ(ElementTypeSize(ElementType::kBytes), 0u);
  EXPECT_EQ(ElementTypeSize(ElementType::kInt16), 2u);
  EXPECT_EQ(ElementTypeSize(ElementType::kUInt16), 2u);
  EXPECT_EQ(ElementTypeSize(ElementType::kInt8), 1u);
  EXPECT_EQ(ElementTypeSize(ElementType::kUInt8), 1u);
  EXPECT_EQ(ElementTypeSize(ElementType::kFloat16), 2u);
}

TEST(Tensor, EveryElementAndMemoryTypeCreates) {
  constexpr uint64_t kCount = 13;
  constexpr uint32_t kRawSize = 6;  // element size of the kBytes tensors
  for (ElementType type : kElementTypes) {
    for (MemoryType memory : kMemoryTypes) {
      SCOPED_TRACE(absl::StrCat(ElementTypeName(type), " ", MemoryTypeName(memory)));
      const uint32_t size = type == ElementType::kBytes ? kRawSize : ElementTypeSize(type);
      const std::vector<uint8_t> initial = Pattern(kCount * size);
      // element_size 0 means "the type's size"; kBytes needs it given.
      ASSERT_OK_AND_ASSIGN(
          std::shared_ptr<Tensor> t,
          Tensor::Create(TestDevice(), type, kCount, type == ElementType::kBytes ? kRawSize : 0,
                         memory, initial.data()));
      EXPECT_EQ(t->element_type(), type);
      EXPECT_EQ(t->memory_type(), memory);
      EXPECT_EQ(t->count(), kCount);
      EXPECT_EQ(t->element_size(), size);
      EXPECT_EQ(t->byte_size(), kCount * size);
      EXPECT_EQ(&t->device(), TestDevice().get());
      EXPECT_NE(t->buffer(), VK_NULL_HANDLE);
      // Only device tensors have a staging buffer.
      EXPECT_EQ(t->staging() != VK_NULL_HANDLE, memory == MemoryType::kDevice);
      // The initial data is on the device, whatever the memory type.
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> on_device, ReadBack(*t));
      EXPECT_EQ(on_device, initial);
      if (memory == MemoryType::kStorage) {
        EXPECT_EQ(t->host_data(), nullptr);
      } else {
        ASSERT_NE(t->host_data(), nullptr);
        EXPECT_EQ(HostBytes(*t), initial);
      }
    }
  }
}

TEST(Tensor, ExplicitElementSizeOfTheType) {
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> t,
      Tensor::Create(TestDevice(), ElementType::kFloat64, 3, 8, MemoryType::kHost, nullptr));
  EXPECT_EQ(t->element_size(), 8u);
  EXPECT_EQ(t->byte_size(), 24u);
}

TEST(Tensor, InitialDataThroughHostData) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e6f, -0.0f};
  for (MemoryType memory : {MemoryType::kDevice, MemoryType::kHost, MemoryType::kDeviceAndHost}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                         Tensor::Create(TestDevice(), ElementType::kFloat32, values.size(), 0,
                                        memory, values.data()));
    ASSERT_NE(t->host_data(), nullptr);
    const float* data = static_cast<const float*>(t->host_data());
    EXPECT_THAT(std::vector<float>(data, data + values.size()), ElementsAreArray(values));
  }
}

// Storage tensors have no host data, also where device-local memory is host-visible (lavapipe,
// integrated GPUs, ReBAR).
TEST(Tensor, StorageHasNoHostData) {
  const std::vector<int32_t> values = {1, 2, 3};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                       Tensor::Create(TestDevice(), ElementType::kInt32, values.size(), 0,
                                      MemoryType::kStorage, values.data()));
  EXPECT_EQ(t->host_data(), nullptr);
  EXPECT_EQ(t->staging(), VK_NULL_HANDLE);
}

TEST(Tensor, StorageInitialDataIsOnTheDevice) {
  const std::vector<int32_t> values = {7, -8, 9, 1 << 30};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                       Tensor::Create(TestDevice(), ElementType::kInt32, values.size(), 0,
                                      MemoryType::kStorage, values.data()));
  EXPECT_EQ(t->staging(), VK_NULL_HANDLE);
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, ReadBack(*t));
  std::vector<int32_t> back(values.size());
  std::memcpy(back.data(), bytes.data(), bytes.size());
  EXPECT_EQ(back, values);
}

// A device whose device-local memory the host does not map, as on a discrete GPU: tensors in it
// get their first contents from commands on a queue.
std::shared_ptr<Device> UnmappedDevice() {
  DeviceOptions options;
  options.map_device_memory = false;
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *device : nullptr;
}

TEST(Tensor, InitialContentsWithOneOffCommands) {
  std::shared_ptr<Device> device = UnmappedDevice();
  ASSERT_NE(device, nullptr);
  const std::vector<uint8_t> data = Pattern(4096);
  for (MemoryType memory : {MemoryType::kDevice, MemoryType::kStorage}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> given,
                         Tensor::Create(device, ElementType::kBytes, data.size(), 1, memory,
                                        data.data(), TensorInit::kWait));
    EXPECT_FALSE(given->init_pending());
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> given_back, ReadBack(*given, device));
    EXPECT_EQ(given_back, data);
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> zeros,
                         Tensor::Create(device, ElementType::kBytes, data.size(), 1, memory,
                                        nullptr, TensorInit::kWait));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> back, ReadBack(*zeros, device));
    EXPECT_THAT(back, Each(0));
  }
}

TEST(Tensor, DeferredInitRunsAheadOfTheFirstSubmission) {
  std::shared_ptr<Device> device = UnmappedDevice();
  ASSERT_NE(device, nullptr);
  const std::vector<uint8_t> data = Pattern(4096, 3);
  std::vector<std::shared_ptr<Tensor>> tensors;
  for (MemoryType memory : {MemoryType::kDevice, MemoryType::kStorage}) {
    for (const void* initial : std::vector<const void*>{data.data(), nullptr}) {
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                           Tensor::Create(device, ElementType::kBytes, data.size(), 1, memory,
                                          initial, TensorInit::kDeferred));
      EXPECT_TRUE(t->init_pending());
      tensors.push_back(std::move(t));
    }
  }
  // Copies of each into a host tensor, in one sequence whose submission carries the inits.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
  std::vector<std::shared_ptr<Tensor>> copies;
  for (const auto& t : tensors) {
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<Tensor> host,
        Tensor::Create(device, ElementType::kBytes, data.size(), 1, MemoryType::kHost, nullptr));
    ASSERT_OK(seq->Record(op::Copy{{t, host}}));
    copies.push_back(std::move(host));
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<TensorInitBatch> batch,
                       TensorInitBatch::Record(device, device->queue(0).family, tensors));
  ASSERT_OK(seq->Submit(batch));
  for (const auto& t : tensors) EXPECT_FALSE(t->init_pending());
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_EQ(HostBytes(*copies[0]), data);       // device, given data
  EXPECT_THAT(HostBytes(*copies[1]), Each(0));  // device, zeros
  EXPECT_EQ(HostBytes(*copies[2]), data);       // storage, given data
  EXPECT_THAT(HostBytes(*copies[3]), Each(0));  // storage, zeros
  // Nothing is left to do: a second batch has nothing to record.
  EXPECT_THAT(TensorInitBatch::Record(device, device->queue(0).family, tensors),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(Tensor, ZeroCount) {
  for (MemoryType memory : kMemoryTypes) {
    SCOPED_TRACE(MemoryTypeName(memory));
    EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kFloat32, 0, 0, memory, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zero-sized")));
  }
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kBytes, 0, 4, MemoryType::kHost, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Tensor, BytesNeedAnElementSize) {
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kBytes, 4, 0, MemoryType::kDevice, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element size")));
}

TEST(Tensor, MismatchedElementSize) {
  EXPECT_THAT(
      Tensor::Create(TestDevice(), ElementType::kFloat32, 4, 8, MemoryType::kDevice, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("element size 8"), HasSubstr("float32"))));
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kBool, 4, 4, MemoryType::kHost, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element size 4")));
  EXPECT_THAT(
      Tensor::Create(TestDevice(), ElementType::kFloat64, 4, 4, MemoryType::kStorage, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float64")));
}

TEST(Tensor, UnknownTypes) {
  EXPECT_THAT(
      Tensor::Create(TestDevice(), static_cast<ElementType>(42), 4, 0, MemoryType::kHost, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("42")));
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kFloat32, 4, 0, static_cast<MemoryType>(9),
                             nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("9")));
}

TEST(Tensor, HugeSizeIsResourceExhausted) {
  constexpr uint64_t kHuge = uint64_t{1} << 50;  // 4 PiB of floats
  for (MemoryType memory : kMemoryTypes) {
    SCOPED_TRACE(MemoryTypeName(memory));
    EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kFloat32, kHuge, 0, memory, nullptr),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
  // The device still works afterwards.
  EXPECT_TRUE(
      Tensor::Create(TestDevice(), ElementType::kFloat32, 4, 0, MemoryType::kDevice, nullptr).ok());
}

TEST(Tensor, LargerThanTheDeviceHeap) {
  std::shared_ptr<Device> device = TestDevice();
  ASSERT_OK_AND_ASSIGN(uint32_t type,
                       device->FindMemoryType(~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT));
  const uint64_t heap = device->HeapSize(type);
  // A little more than the whole heap: rejected before (or by) the allocation.
  const uint64_t count = heap / 4 + (uint64_t{1} << 20);
  for (MemoryType memory : {MemoryType::kStorage, MemoryType::kDevice}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    EXPECT_THAT(Tensor::Create(device, ElementType::kFloat32, count, 0, memory, nullptr),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
}

TEST(Tensor, SizeOverflow) {
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kFloat64, uint64_t{1} << 62, 0,
                             MemoryType::kHost, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  EXPECT_THAT(Tensor::Create(TestDevice(), ElementType::kBytes, ~uint64_t{0}, 16,
                             MemoryType::kDevice, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

// Fills device memory with a pattern and frees it, so that zero-filling is not a mere accident
// of fresh memory.
void DirtyMemory(uint64_t bytes) {
  for (MemoryType memory : kMemoryTypes) {
    const std::vector<uint8_t> junk = Pattern(bytes, 0x5a);
    auto t = Tensor::Create(TestDevice(), ElementType::kBytes, bytes, 1, memory, junk.data());
    EXPECT_TRUE(t.ok()) << t.status();
  }
}

TEST(Tensor, ReservedTensorIsZeroFilled) {
  constexpr uint64_t kCount = 1000;
  for (MemoryType memory : kMemoryTypes) {
    SCOPED_TRACE(MemoryTypeName(memory));
    DirtyMemory(kCount * 4);
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<Tensor> t,
        Tensor::Create(TestDevice(), ElementType::kUInt32, kCount, 0, memory, nullptr));
    ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> on_device, ReadBack(*t));
    EXPECT_THAT(on_device, Each(0));
    if (memory != MemoryType::kStorage) {
      EXPECT_THAT(HostBytes(*t), Each(0));
    }
  }
}

// Sizes that are not a whole number of 4-byte words: vkCmdFillBuffer only clears whole words, so
// the tail needs care. Dirty memory is freed first so that zeros are not an accident.
TEST(Tensor, ReservedTensorOfOddSizeIsZeroFilled) {
  for (MemoryType memory : kMemoryTypes) {
    for (uint64_t bytes : {1, 2, 3, 5, 7, 9, 63}) {
      SCOPED_TRACE(absl::StrCat(MemoryTypeName(memory), ", ", bytes, " bytes"));
      {
        const std::vector<uint8_t> junk(bytes, 0xff);
        ASSERT_OK_AND_ASSIGN(
            std::shared_ptr<Tensor> dirty,
            Tensor::Create(TestDevice(), ElementType::kBytes, bytes, 1, memory, junk.data()));
      }
      ASSERT_OK_AND_ASSIGN(
          std::shared_ptr<Tensor> t,
          Tensor::Create(TestDevice(), ElementType::kBytes, bytes, 1, memory, nullptr));
      EXPECT_EQ(t->byte_size(), bytes);
      ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> on_device, ReadBack(*t));
      EXPECT_THAT(on_device, Each(0));
      if (memory != MemoryType::kStorage) {
        EXPECT_THAT(HostBytes(*t), Each(0));
      }
    }
  }
}

TEST(Tensor, KeepsItsDeviceAlive) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  const std::vector<float> values = {4, 5, 6};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                       Tensor::Create(device, ElementType::kFloat32, values.size(), 0,
                                      MemoryType::kDevice, values.data()));
  Device* raw = device.get();
  device.reset();
  EXPECT_EQ(&t->device(), raw);
  EXPECT_NE(t->device().handle(), VK_NULL_HANDLE);
  const float* data = static_cast<const float*>(t->host_data());
  EXPECT_EQ(std::vector<float>(data, data + 3), values);
}

TEST(Buffer, CreateAndMove) {
  std::shared_ptr<Device> device = TestDevice();
  ASSERT_OK_AND_ASSIGN(Buffer host, Buffer::Create(*device, 256, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                                   VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                       VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                                   0, "a test buffer"));
  EXPECT_NE(host.handle(), VK_NULL_HANDLE);
  EXPECT_NE(host.mapped(), nullptr);
  EXPECT_EQ(host.size(), 256u);
  EXPECT_TRUE(host.properties() & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);

  const VkBuffer handle = host.handle();
  Buffer moved = std::move(host);
  EXPECT_EQ(moved.handle(), handle);
  EXPECT_EQ(host.handle(), VK_NULL_HANDLE);  // NOLINT(bugprone-use-after-move)
}

TEST(Buffer, NoMatchingMemoryType) {
  // Protected memory is never host-visible.
  EXPECT_THAT(Buffer::Create(*TestDevice(), 64, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                             VK_MEMORY_PROPERTY_PROTECTED_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                             0, "an impossible buffer"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace komputed::core
