// Tests of op_semantics.h and types.h: the rules of operations and tensor shapes that every
// backend shares. No device is needed.

#include "komputed/core/op_semantics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "komputed/core/types.h"
#include "support/status_matchers.h"

namespace komputed::core {
namespace {

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
  EXPECT_THAT(CheckTensorShape(static_cast<ElementType>(9), MemoryType::kDevice, 1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown element type 9")));
  EXPECT_THAT(CheckTensorShape(ElementType::kBool, static_cast<MemoryType>(7), 1, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown memory type 7")));
}

}  // namespace
}  // namespace komputed::core
