// Tests of failure handling, with FaultInjectingCalls making allocations, submissions and fence
// waits fail on demand.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "komputed/core/vulkan_calls.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<Tensor>> Floats(const std::shared_ptr<Device>& device,
                                               const std::vector<float>& values,
                                               MemoryType memory = MemoryType::kDevice) {
  return Tensor::Create(device, ElementType::kFloat32, values.size(), 0, memory, values.data());
}

std::vector<float> HostFloats(const Tensor& t) {
  const float* p = static_cast<const float*>(t.host_data());
  return std::vector<float>(p, p + t.count());
}

// b += a over 3 elements, recorded with a sync to host of b.
struct Work {
  std::shared_ptr<Tensor> a, b;
  std::shared_ptr<Algorithm> add;
  std::unique_ptr<Sequence> seq;
};

absl::StatusOr<Work> MakeWork(const std::shared_ptr<Device>& device) {
  static const auto* spirv = new absl::StatusOr<std::vector<uint32_t>>(CompileGlsl(kAddShader));
  if (!spirv->ok()) return spirv->status();
  Work w;
  absl::StatusOr<std::shared_ptr<Tensor>> a = Floats(device, {1, 2, 3});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::shared_ptr<Tensor>> b = Floats(device, {0, 0, 0});
  if (!b.ok()) return b.status();
  w.a = *a;
  w.b = *b;
  AlgorithmSpec spec;
  spec.tensors = {w.a, w.b};
  spec.spirv = **spirv;
  spec.workgroup = {3, 1, 1};
  absl::StatusOr<std::shared_ptr<Algorithm>> add = Algorithm::Create(device, spec);
  if (!add.ok()) return add.status();
  w.add = *add;
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(device, 0, 0);
  if (!seq.ok()) return seq.status();
  w.seq = *std::move(seq);
  if (absl::Status s = w.seq->Record(op::Dispatch{w.add}); !s.ok()) return s;
  if (absl::Status s = w.seq->Record(op::SyncToHost{{w.b}}); !s.ok()) return s;
  return w;
}

TEST(Faults, PassThroughByDefault) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  EXPECT_EQ(&f.device->calls(), f.calls.get());
  const int allocations = f.calls->Count(VulkanCall::kAllocateMemory);
  const int submissions = f.calls->Count(VulkanCall::kQueueSubmit);
  const int waits = f.calls->Count(VulkanCall::kWaitForFences);
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork(f.device));
  ASSERT_OK(w.seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(1, 2, 3));
  // Two device tensors (buffer and staging each), created with one-off submissions; then the eval.
  EXPECT_EQ(f.calls->Count(VulkanCall::kAllocateMemory), allocations + 4);
  EXPECT_EQ(f.calls->Count(VulkanCall::kQueueSubmit), submissions + 3);
  EXPECT_GE(f.calls->Count(VulkanCall::kWaitForFences), waits + 3);
}

TEST(Faults, AllocationOutOfDeviceMemory) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  const int before = f.calls->Count(VulkanCall::kAllocateMemory);
  f.calls->FailNext(VulkanCall::kAllocateMemory, VK_ERROR_OUT_OF_DEVICE_MEMORY);
  EXPECT_THAT(
      Floats(f.device, {1, 2, 3}),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("VK_ERROR_OUT_OF_DEVICE_MEMORY"), HasSubstr("vkAllocateMemory"))));
  EXPECT_EQ(f.calls->Count(VulkanCall::kAllocateMemory), before + 1);
  EXPECT_FALSE(f.device->lost());
  // Only the next call failed.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Floats(f.device, {1, 2, 3}));
  EXPECT_THAT(HostFloats(*t), ElementsAre(1, 2, 3));
}

TEST(Faults, AllocationFailuresForEveryMemoryType) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  for (MemoryType memory :
       {MemoryType::kDevice, MemoryType::kHost, MemoryType::kStorage, MemoryType::kDeviceAndHost}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    f.calls->FailNext(VulkanCall::kAllocateMemory, VK_ERROR_OUT_OF_HOST_MEMORY);
    EXPECT_THAT(
        Floats(f.device, {1, 2}, memory),
        StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("VK_ERROR_OUT_OF_HOST_MEMORY")));
    EXPECT_TRUE(Floats(f.device, {1, 2}, memory).ok());
  }
}

TEST(Faults, SeveralAllocationFailures) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  f.calls->FailNext(VulkanCall::kAllocateMemory, VK_ERROR_OUT_OF_DEVICE_MEMORY, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(Floats(f.device, {1}, MemoryType::kHost),
                StatusIs(absl::StatusCode::kResourceExhausted));
  }
  EXPECT_TRUE(Floats(f.device, {1}, MemoryType::kHost).ok());
}

TEST(Faults, SubmitDeviceLost) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork(f.device));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> other, Sequence::Create(f.device, 0, 0));
  ASSERT_OK(other->Record(op::SyncToHost{{w.a}}));

  f.calls->FailNext(VulkanCall::kQueueSubmit, VK_ERROR_DEVICE_LOST);
  EXPECT_THAT(w.seq->Submit(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("VK_ERROR_DEVICE_LOST")));
  EXPECT_TRUE(f.device->lost());
  EXPECT_FALSE(w.seq->IsRunning());
  ASSERT_OK(w.seq->Wait(kTimeout));  // nothing in flight

  // Every later submission fails, without reaching the driver.
  const int submissions = f.calls->Count(VulkanCall::kQueueSubmit);
  EXPECT_THAT(w.seq->Submit(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("lost")));
  EXPECT_THAT(w.seq->Eval(kTimeout), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(other->Eval(kTimeout), StatusIs(absl::StatusCode::kUnavailable));
  // ...also the one-off submissions that initialise new device tensors.
  EXPECT_THAT(Floats(f.device, {1, 2}, MemoryType::kDevice),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(f.calls->Count(VulkanCall::kQueueSubmit), submissions);
  EXPECT_TRUE(f.device->lost());
}

TEST(Faults, SubmitOutOfMemoryCanBeRetried) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork(f.device));
  f.calls->FailNext(VulkanCall::kQueueSubmit, VK_ERROR_OUT_OF_HOST_MEMORY);
  EXPECT_THAT(w.seq->Submit(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(w.seq->IsRunning());
  EXPECT_FALSE(f.device->lost());
  ASSERT_OK(w.seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(1, 2, 3));  // ran once
}

TEST(Faults, AFailedSubmissionOfSeveralLeavesNoneRunning) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work first, MakeWork(f.device));
  ASSERT_OK_AND_ASSIGN(Work second, MakeWork(f.device));
  const std::vector<Sequence::Submission> both = {{first.seq.get(), nullptr},
                                                  {second.seq.get(), nullptr}};
  f.calls->FailNext(VulkanCall::kQueueSubmit, VK_ERROR_OUT_OF_HOST_MEMORY);
  for (const absl::Status& s : Sequence::SubmitTogether(both)) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  }
  EXPECT_FALSE(first.seq->IsRunning());
  EXPECT_FALSE(second.seq->IsRunning());
  ASSERT_OK(first.seq->Wait(kTimeout));  // nothing in flight
  // Both can be submitted again, and each runs once.
  for (const absl::Status& s : Sequence::SubmitTogether(both)) ASSERT_OK(s);
  ASSERT_OK(first.seq->Wait(kTimeout));
  ASSERT_OK(second.seq->Wait(kTimeout));
  EXPECT_THAT(HostFloats(*first.b), ElementsAre(1, 2, 3));
  EXPECT_THAT(HostFloats(*second.b), ElementsAre(1, 2, 3));
}

TEST(Faults, AWaitForOneOfSeveralSubmittedTogetherTimesOut) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  if (!f.device->timeline_supported()) GTEST_SKIP() << "no timeline semaphores: submitted alone";
  ASSERT_OK_AND_ASSIGN(Work first, MakeWork(f.device));
  ASSERT_OK_AND_ASSIGN(Work second, MakeWork(f.device));
  for (const absl::Status& s :
       Sequence::SubmitTogether({{first.seq.get(), nullptr}, {second.seq.get(), nullptr}})) {
    ASSERT_OK(s);
  }
  // The first has no fence of its own: its wait is on its timeline semaphore.
  f.calls->FailNext(VulkanCall::kWaitForFences, VK_TIMEOUT);
  EXPECT_THAT(first.seq->Wait(kTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(first.seq->IsRunning());
  EXPECT_FALSE(f.device->lost());
  ASSERT_OK(first.seq->Wait(kTimeout));
  ASSERT_OK(second.seq->Wait(kTimeout));
  EXPECT_THAT(HostFloats(*first.b), ElementsAre(1, 2, 3));
  EXPECT_THAT(HostFloats(*second.b), ElementsAre(1, 2, 3));
}

TEST(Faults, WaitTimesOut) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork(f.device));
  ASSERT_OK(w.seq->Submit());
  f.calls->FailNext(VulkanCall::kWaitForFences, VK_TIMEOUT);
  EXPECT_THAT(w.seq->Wait(kTimeout), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(w.seq->IsRunning());
  EXPECT_FALSE(f.device->lost());
  // The submission is still there to be waited for.
  ASSERT_OK(w.seq->Wait(kTimeout));
  EXPECT_FALSE(w.seq->IsRunning());
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(1, 2, 3));
}

TEST(Faults, WaitDeviceLost) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork(f.device));
  ASSERT_OK(w.seq->Submit());
  f.calls->FailNext(VulkanCall::kWaitForFences, VK_ERROR_DEVICE_LOST);
  EXPECT_THAT(w.seq->Wait(kTimeout), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(f.device->lost());
  EXPECT_FALSE(w.seq->IsRunning());
  // The injected loss left the real submission running: let it finish before going on (the
  // sequence would otherwise reset a fence still in use).
  vkDeviceWaitIdle(f.device->handle());
  EXPECT_THAT(w.seq->Submit(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(Faults, OneOffWaitTimesOut) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice f, MakeFaultyDevice());
  // Device tensors are initialised with a one-off submission, which waits on a fence.
  f.calls->FailNext(VulkanCall::kWaitForFences, VK_TIMEOUT);
  EXPECT_THAT(Floats(f.device, {1, 2}, MemoryType::kDevice),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(f.device->lost());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Floats(f.device, {1, 2}, MemoryType::kDevice));
  EXPECT_THAT(HostFloats(*t), ElementsAre(1, 2));
}

TEST(Faults, FaultsOfOneDeviceStayThere) {
  ASSERT_OK_AND_ASSIGN(FaultyDevice lost, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(FaultyDevice fine, MakeFaultyDevice());
  ASSERT_OK_AND_ASSIGN(Work w_lost, MakeWork(lost.device));
  ASSERT_OK_AND_ASSIGN(Work w_fine, MakeWork(fine.device));
  lost.calls->FailNext(VulkanCall::kQueueSubmit, VK_ERROR_DEVICE_LOST);
  EXPECT_THAT(w_lost.seq->Eval(kTimeout), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(lost.device->lost());
  EXPECT_FALSE(fine.device->lost());
  ASSERT_OK(w_fine.seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*w_fine.b), ElementsAre(1, 2, 3));
}

}  // namespace
}  // namespace komputed::core
