// Tests of MemoryPool: small tensors' buffers share blocks, each keeps its own bytes, pieces go
// back and empty blocks are freed, large buffers and failed allocations take nothing from it.

#include "komputed/core/memory_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "komputed/core/device.h"
#include "komputed/core/tensor.h"
#include "komputed/core/vulkan_calls.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::HasSubstr;

std::vector<float> Values(size_t count, float seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = seed + static_cast<float>(i) * 0.5f;
  return v;
}

// The tensor's device contents, brought to its host data by a one-off command.
std::vector<float> DeviceFloats(Device& device, Tensor& t) {
  std::fill_n(static_cast<float*>(t.host_data()), t.count(), -1.0f);
  const absl::Status s = device.RunOnce([&](VkCommandBuffer cb) { t.RecordToHost(cb); });
  EXPECT_TRUE(s.ok()) << s;
  const float* p = static_cast<const float*>(t.host_data());
  return std::vector<float>(p, p + t.count());
}

class MemoryPoolTest : public ::testing::TestWithParam<bool> {};

TEST_P(MemoryPoolTest, SmallTensorsShareBlocksAndKeepTheirOwnData) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice d, MakeFaultyDevice(/*map_device_memory=*/GetParam()));
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(d.device);
  const int allocations_before = d.calls->Count(VulkanCall::kAllocateMemory);
  std::vector<std::shared_ptr<Tensor>> tensors;
  std::vector<std::vector<float>> values;
  // Odd sizes, so that pieces end off any alignment.
  for (size_t k = 0; k < 24; ++k) {
    values.push_back(Values(1 + k * 13, static_cast<float>(k) * 100.0f));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                         Tensor::Create(d.device, ElementType::kFloat32, values.back().size(), 0,
                                        MemoryType::kDevice, values.back().data(),
                                        TensorInit::kWait, nullptr, pool.get()));
    tensors.push_back(std::move(t));
  }
  // Each tensor: its device buffer and its staging buffer, 48 pieces of at most 2 memory types.
  EXPECT_EQ(pool->pieces(), 48u);
  EXPECT_LE(pool->blocks(), 2u);
  EXPECT_EQ(d.calls->Count(VulkanCall::kAllocateMemory) - allocations_before,
            static_cast<int>(pool->blocks()));
  for (size_t k = 0; k < tensors.size(); ++k) {
    EXPECT_EQ(DeviceFloats(*d.device, *tensors[k]), values[k]) << "tensor " << k;
  }
  // Every other tensor goes; new ones take the freed ranges, and all still hold their own data.
  for (size_t k = 0; k < tensors.size(); k += 2) tensors[k].reset();
  EXPECT_EQ(pool->pieces(), 24u);
  for (size_t k = 0; k < tensors.size(); k += 2) {
    values[k] = Values(values[k].size(), -static_cast<float>(k));
    ASSERT_OK_AND_ASSIGN(
        tensors[k],
        Tensor::Create(d.device, ElementType::kFloat32, values[k].size(), 0, MemoryType::kDevice,
                       values[k].data(), TensorInit::kWait, nullptr, pool.get()));
  }
  EXPECT_LE(pool->blocks(), 2u);
  for (size_t k = 0; k < tensors.size(); ++k) {
    EXPECT_EQ(DeviceFloats(*d.device, *tensors[k]), values[k]) << "tensor " << k;
  }
  tensors.clear();
  EXPECT_EQ(pool->pieces(), 0u);
  EXPECT_EQ(pool->blocks(), 0u);
}

TEST_P(MemoryPoolTest, ReusedRangesStartZeroed) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice d, MakeFaultyDevice(/*map_device_memory=*/GetParam()));
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(d.device);
  // A keeper holds the block while the first tensor's range is given back and taken again.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> keeper,
                       Tensor::Create(d.device, ElementType::kFloat32, 4, 0, MemoryType::kDevice,
                                      nullptr, TensorInit::kWait, nullptr, pool.get()));
  const std::vector<float> secret = Values(256, 7.0f);
  {
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<Tensor> first,
        Tensor::Create(d.device, ElementType::kFloat32, secret.size(), 0, MemoryType::kDevice,
                       secret.data(), TensorInit::kWait, nullptr, pool.get()));
  }
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> second,
      Tensor::Create(d.device, ElementType::kFloat32, secret.size(), 0, MemoryType::kDevice,
                     nullptr, TensorInit::kWait, nullptr, pool.get()));
  EXPECT_EQ(DeviceFloats(*d.device, *second), std::vector<float>(secret.size(), 0.0f));
  const float* host = static_cast<const float*>(second->host_data());
  EXPECT_EQ(std::vector<float>(host, host + secret.size()),
            std::vector<float>(secret.size(), 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Mapping, MemoryPoolTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "DeviceMemoryMapped" : "DeviceMemoryByCommands";
                         });

TEST(MemoryPool, LargeBuffersGetMemoryOfTheirOwn) {
  std::shared_ptr<Device> device = TestDevice();
  MemoryPool::Options options;
  options.max_piece_bytes = 4096;
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(device, options);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> large,
                       Tensor::Create(device, ElementType::kFloat32, 4096, 0, MemoryType::kDevice,
                                      nullptr, TensorInit::kWait, nullptr, pool.get()));
  EXPECT_EQ(pool->pieces(), 0u);
  EXPECT_EQ(pool->blocks(), 0u);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> small,
                       Tensor::Create(device, ElementType::kFloat32, 16, 0, MemoryType::kHost,
                                      nullptr, TensorInit::kWait, nullptr, pool.get()));
  EXPECT_EQ(pool->pieces(), 1u);
}

TEST(MemoryPool, PiecesAreAlignedAndApart) {
  std::shared_ptr<Device> device = TestDevice();
  MemoryPool::Options options;
  options.block_bytes = 4096;
  options.max_piece_bytes = 1024;
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(device, options);
  ASSERT_OK_AND_ASSIGN(
      uint32_t type,
      device->FindMemoryType(
          ~0u, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0));
  const VkMemoryRequirements req{100, 64, 1u << type};
  std::vector<MemoryPiece> pieces;
  for (int k = 0; k < 40; ++k) {  // 40 × 128 bytes: two blocks of 32
    ASSERT_OK_AND_ASSIGN(MemoryPiece piece, pool->Allocate(req, type, "a test piece"));
    EXPECT_EQ(piece.offset() % 64, 0u);
    EXPECT_EQ(piece.size(), 100u);
    ASSERT_NE(piece.mapped(), nullptr);
    pieces.push_back(std::move(piece));
  }
  EXPECT_EQ(pool->blocks(), 2u);
  for (size_t a = 0; a < pieces.size(); ++a) {
    for (size_t b = a + 1; b < pieces.size(); ++b) {
      if (pieces[a].memory() != pieces[b].memory()) continue;
      const bool apart = pieces[a].offset() + pieces[a].size() <= pieces[b].offset() ||
                         pieces[b].offset() + pieces[b].size() <= pieces[a].offset();
      EXPECT_TRUE(apart) << "pieces " << a << " and " << b;
    }
  }
  // The second block empties and goes; ranges given back in the first coalesce into room for a
  // piece larger than any one of them.
  pieces.resize(32);
  ASSERT_EQ(pieces[0].memory(), pieces[31].memory());  // the first 32 filled the first block
  EXPECT_EQ(pool->blocks(), 1u);
  for (int k = 4; k < 12; ++k) pieces[k].Reset();
  const VkMemoryRequirements big{900, 64, 1u << type};
  ASSERT_OK_AND_ASSIGN(MemoryPiece merged, pool->Allocate(big, type, "a larger piece"));
  EXPECT_EQ(merged.memory(), pieces[0].memory());
  EXPECT_EQ(pool->blocks(), 1u);
  pieces.clear();
  merged.Reset();
  EXPECT_EQ(pool->blocks(), 0u);
}

TEST(MemoryPool, ServesSmallCoherentRequirementsOnly) {
  std::shared_ptr<Device> device = TestDevice();
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(device);
  ASSERT_OK_AND_ASSIGN(uint32_t type,
                       device->FindMemoryType(~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0));
  EXPECT_TRUE(pool->Serves({4096, 256, 1u << type}, type));
  EXPECT_FALSE(pool->Serves({(16u << 10) + 1, 256, 1u << type}, type));  // over max_piece_bytes
  EXPECT_FALSE(pool->Serves({0, 256, 1u << type}, type));
  EXPECT_FALSE(pool->Serves({4096, 96, 1u << type}, type));  // not a power of two
  EXPECT_FALSE(pool->Serves({4096, 256, ~0u}, VK_MAX_MEMORY_TYPES));
  EXPECT_THAT(pool->Allocate({(16u << 10) + 1, 256, 1u << type}, type, "a big buffer").status(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("a big buffer")));
}

TEST(MemoryPool, FailedBlockAllocationTakesNothing) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice d, MakeFaultyDevice(/*map_device_memory=*/true));
  std::shared_ptr<MemoryPool> pool = MemoryPool::Create(d.device);
  d.calls->FailNext(VulkanCall::kAllocateMemory, VK_ERROR_OUT_OF_DEVICE_MEMORY);
  const std::vector<float> values = Values(64, 1.0f);
  EXPECT_THAT(Tensor::Create(d.device, ElementType::kFloat32, values.size(), 0, MemoryType::kDevice,
                             values.data(), TensorInit::kWait, nullptr, pool.get())
                  .status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("block")));
  EXPECT_EQ(pool->blocks(), 0u);
  EXPECT_EQ(pool->pieces(), 0u);
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> t,
      Tensor::Create(d.device, ElementType::kFloat32, values.size(), 0, MemoryType::kDevice,
                     values.data(), TensorInit::kWait, nullptr, pool.get()));
  EXPECT_EQ(DeviceFloats(*d.device, *t), values);
}

}  // namespace
}  // namespace komputed::core
