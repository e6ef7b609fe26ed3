// Tests of op_semantics.h and types.h: the rules of operations and tensor shapes that every
// backend shares. No device is needed.

#include "komputed/core/op_semantics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <vulkan/vulkan_core.h>

#include <optional>
#include <vector>

#include "komputed/core/types.h"
#include "support/status_matchers.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

int a_, b_, c_;  // identities

TensorFacts Facts(const void* id, MemoryType memory = MemoryType::kDevice, uint64_t count = 4,
                  ElementType type = ElementType::kFloat32) {
  return {id, type, ElementTypeSize(type), count, memory};
}

TEST(OpSemantics, NamesAreKomputes) {
  EXPECT_EQ(OpName(OpKind::kSyncDevice), "OpTensorSyncDevice");
  EXPECT_EQ(OpName(OpKind::kSyncLocal), "OpTensorSyncLocal");
  EXPECT_EQ(OpName(OpKind::kCopy), "OpTensorCopy");
  EXPECT_EQ(OpName(OpKind::kDispatch), "OpAlgoDispatch");
  EXPECT_EQ(OpName(OpKind::kBarrier), "OpMemoryBarrier");
}

TEST(OpSemantics, SyncsNeedATensor) {
  EXPECT_THAT(ValidateOpTensors(OpKind::kSyncDevice, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("OpTensorSyncDevice needs at least 1 tensor(s), got 0")));
  EXPECT_THAT(ValidateOpTensors(OpKind::kSyncLocal, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("OpTensorSyncLocal")));
  const TensorFacts one[] = {Facts(&a_)};
  ASSERT_OK(ValidateOpTensors(OpKind::kSyncDevice, one));
  ASSERT_OK(ValidateOpTensors(OpKind::kBarrier, {}));
  ASSERT_OK(ValidateOpTensors(OpKind::kDispatch, {}));
}

TEST(OpSemantics, CopyNeedsASourceAndADestination) {
  const TensorFacts one[] = {Facts(&a_)};
  EXPECT_THAT(ValidateOpTensors(OpKind::kCopy, one),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("OpTensorCopy needs at least 2 tensor(s), got 1")));
  const TensorFacts two[] = {Facts(&a_), Facts(&b_)};
  ASSERT_OK(ValidateOpTensors(OpKind::kCopy, two));
}

TEST(OpSemantics, CopyOntoItsOwnSourceIsRejected) {
  const TensorFacts t[] = {Facts(&a_), Facts(&b_), Facts(&a_)};
  EXPECT_THAT(ValidateOpTensors(OpKind::kCopy, t),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 2 is the source (tensor 0) itself")));
}

TEST(OpSemantics, CopyNeedsTheSourcesTypeAndCount) {
  const TensorFacts type[] = {Facts(&a_), Facts(&b_, MemoryType::kDevice, 4, ElementType::kInt32)};
  EXPECT_THAT(ValidateOpTensors(OpKind::kCopy, type),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 1 holds int32 elements of 4 bytes but the source "
                                 "(tensor 0) holds float32")));
  const TensorFacts count[] = {Facts(&a_), Facts(&b_), Facts(&c_, MemoryType::kDevice, 5)};
  EXPECT_THAT(ValidateOpTensors(OpKind::kCopy, count),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 2 has 5 elements but the source (tensor 0) has 4")));
}

TEST(OpSemantics, PushConstantSizeMustMatchTheBuild) {
  ASSERT_OK(CheckPushConstantSize(8, 8));
  EXPECT_THAT(
      CheckPushConstantSize(4, 8),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("push constants of 4 bytes given; the algorithm was built with 8")));
}

TEST(OpSemantics, AnOverrideStaysWithTheAlgorithm) {
  std::vector<uint8_t> algorithm = {1, 2, 3, 4};
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> first,
                       ResolvePushConstants(std::vector<uint8_t>{5, 6, 7, 8}, algorithm));
  EXPECT_THAT(first, ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(algorithm, ElementsAre(5, 6, 7, 8));
  ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> later, ResolvePushConstants(std::nullopt, algorithm));
  EXPECT_THAT(later, ElementsAre(5, 6, 7, 8));
}

TEST(OpSemantics, AMisSizedOverrideChangesNothing) {
  std::vector<uint8_t> algorithm = {1, 2, 3, 4};
  EXPECT_THAT(ResolvePushConstants(std::vector<uint8_t>{9}, algorithm).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("OpAlgoDispatch")));
  EXPECT_THAT(algorithm, ElementsAre(1, 2, 3, 4));
}

TEST(OpSemantics, WhichHostDataMoves) {
  for (OpKind kind : {OpKind::kSyncDevice, OpKind::kSyncLocal, OpKind::kCopy, OpKind::kDispatch,
                      OpKind::kBarrier}) {
    // Host-coherent data is the memory: it goes up before and comes back after any op.
    EXPECT_TRUE(HostDataGoesUp(kind, MemoryType::kHost));
    EXPECT_TRUE(HostDataComesBack(kind, MemoryType::kDeviceAndHost));
    // Storage tensors have no host data.
    EXPECT_FALSE(HostDataGoesUp(kind, MemoryType::kStorage));
    EXPECT_FALSE(HostDataComesBack(kind, MemoryType::kStorage));
  }
  // Staged data moves with the sync ops only.
  EXPECT_TRUE(HostDataGoesUp(OpKind::kSyncDevice, MemoryType::kDevice));
  EXPECT_FALSE(HostDataComesBack(OpKind::kSyncDevice, MemoryType::kDevice));
  EXPECT_TRUE(HostDataComesBack(OpKind::kSyncLocal, MemoryType::kDevice));
  EXPECT_FALSE(HostDataGoesUp(OpKind::kSyncLocal, MemoryType::kDevice));
  EXPECT_FALSE(HostDataGoesUp(OpKind::kDispatch, MemoryType::kDevice));
  EXPECT_FALSE(HostDataComesBack(OpKind::kCopy, MemoryType::kDevice));
}

TEST(OpSemantics, ACopysHostStepReachesStagedDestinationsOnly) {
  const TensorFacts t[] = {Facts(&a_), Facts(&b_, MemoryType::kHost), Facts(&c_),
                           Facts(&b_, MemoryType::kStorage)};
  EXPECT_THAT(CopyHostTargets(t), ElementsAre(2));
  const TensorFacts from_storage[] = {Facts(&a_, MemoryType::kStorage), Facts(&b_)};
  EXPECT_THAT(CopyHostTargets(from_storage), IsEmpty());
}

TEST(TensorShape, NaturalSizesAndRawBytes) {
  ASSERT_OK_AND_ASSIGN(uint32_t f,
                       CheckTensorShape(ElementType::kFloat64, MemoryType::kDevice, 3, 0));
  EXPECT_EQ(f, 8u);
  ASSERT_OK_AND_ASSIGN(uint32_t raw,
                       CheckTensorShape(ElementType::kBytes, MemoryType::kHost, 3, 12));
  EXPECT_EQ(raw, 12u);
}

TEST(TensorShape, BadShapesNameWhatIsWrong) {
  EXPECT_THAT(CheckTensorShape(ElementType::kBytes, MemoryType::kDevice, 3, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("raw bytes")));
  EXPECT_THAT(CheckTensorShape(ElementType::kInt32, MemoryType::kDevice, 3, 8).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element size 8 does not match int32 (4 bytes")));
  EXPECT_THAT(CheckTensorShape(ElementType::kInt32, MemoryType::kDevice, 0, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 elements")));
  EXPECT_THAT(
      CheckTensorShape(ElementType::kBytes, MemoryType::kDevice, uint64_t{1} << 62, 8).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  EXPECT_THAT(CheckTensorShape(static_cast<ElementType>(11), MemoryType::kDevice, 1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown element type 11")));
  EXPECT_THAT(CheckTensorShape(ElementType::kFloat16, MemoryType::kDevice, 3, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element size 4 does not match float16 (2 bytes")));
  EXPECT_THAT(CheckTensorShape(ElementType::kUInt8, MemoryType::kDevice, 3, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element size 2 does not match uint8 (1 bytes")));
  EXPECT_THAT(CheckTensorShape(ElementType::kBool, static_cast<MemoryType>(7), 1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown memory type 7")));
}

// Each access mask against the stages it is paired with (Vulkan's "supported access types").
TEST(OpSemantics, BarrierMasksMatchTheirStages) {
  constexpr uint32_t kCompute = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  constexpr uint32_t kTransfer = VK_PIPELINE_STAGE_TRANSFER_BIT;
  constexpr uint32_t kHost = VK_PIPELINE_STAGE_HOST_BIT;
  constexpr uint32_t kAll = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
  constexpr uint32_t kTop = VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT;
  constexpr uint32_t kBottom = VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT;
  constexpr uint32_t kShaderRw = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  // Accepted: each access with a stage that supports it.
  for (const BarrierMasks& ok : {
           BarrierMasks{VK_ACCESS_SHADER_WRITE_BIT, kShaderRw, kCompute, kCompute},
           BarrierMasks{VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT, kTransfer,
                        kCompute},
           BarrierMasks{VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT, kCompute, kHost},
           BarrierMasks{VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                        VK_ACCESS_UNIFORM_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT,
                        kCompute | kTransfer, kAll},
           BarrierMasks{0, 0, kTop, kBottom},
           BarrierMasks{VK_ACCESS_MEMORY_WRITE_BIT, VK_ACCESS_MEMORY_READ_BIT, kAll, kCompute},
           BarrierMasks{VK_ACCESS_HOST_WRITE_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT, kHost,
                        VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT},
       }) {
    ASSERT_OK(ValidateBarrierMasks(ok));
  }
  // A shader write paired with the transfer stage.
  EXPECT_THAT(
      ValidateBarrierMasks({VK_ACCESS_SHADER_WRITE_BIT, kShaderRw, kTransfer, kCompute}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("OpMemoryBarrier"), HasSubstr("srcAccessMask 0x40 (SHADER_WRITE)"),
                     HasSubstr("srcStageMask 0x1000 (TRANSFER)"), HasSubstr("has bits 0x40"))));
  // The destination side, with one bit of two at fault.
  EXPECT_THAT(ValidateBarrierMasks({VK_ACCESS_SHADER_WRITE_BIT,
                                    VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT, kCompute,
                                    kTransfer}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dstAccessMask 0x2800 (TRANSFER_READ|HOST_READ)"),
                             HasSubstr("has bits 0x2000 (HOST_READ)"))));
  // Top of pipe supports no access of its own.
  EXPECT_THAT(ValidateBarrierMasks({VK_ACCESS_SHADER_WRITE_BIT, 0, kTop, kCompute}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TOP_OF_PIPE")));
  // Graphics-only accesses have no stage on a compute queue, not even ALL_COMMANDS.
  EXPECT_THAT(ValidateBarrierMasks({VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT, 0, kAll, kCompute}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLOR_ATTACHMENT_WRITE")));
  // Graphics and unknown stages are refused.
  EXPECT_THAT(ValidateBarrierMasks(
                  {0, VK_ACCESS_SHADER_READ_BIT, kCompute, VK_PIPELINE_STAGE_FRAGMENT_SHADER_BIT}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dstStageMask"), HasSubstr("FRAGMENT_SHADER"),
                             HasSubstr("not stages of a compute queue"))));
  EXPECT_THAT(ValidateBarrierMasks({0, 0, kCompute | 0x40000000u, kCompute}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0x40000000")));
  EXPECT_THAT(ValidateBarrierMasks({0x80000000u, 0, kAll, kCompute}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0x80000000")));
  // A stage mask of 0 names no stage.
  EXPECT_THAT(ValidateBarrierMasks({0, 0, 0, kCompute}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("srcStageMask is 0")));
}

}  // namespace
}  // namespace komputed::core
