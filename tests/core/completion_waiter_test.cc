// Tests of CompletionWaiter: callbacks once submissions complete, deadlines, shutdown.

#include "komputed/core/completion_waiter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;

const std::vector<uint32_t>& Spirv(const char* source) {
  static auto* add = new absl::StatusOr<std::vector<uint32_t>>(CompileGlsl(kAddShader));
  static auto* busy = new absl::StatusOr<std::vector<uint32_t>>(CompileGlsl(kBusyShader));
  static const std::vector<uint32_t> empty;
  const auto* spirv = source == kAddShader ? add : busy;
  EXPECT_TRUE(spirv->ok()) << spirv->status();
  return spirv->ok() ? **spirv : empty;
}

std::vector<float> HostFloats(const Tensor& t) {
  const float* p = static_cast<const float*>(t.host_data());
  return std::vector<float>(p, p + t.count());
}

// A sequence doing b += a (a = {1, 2, 3}) and syncing b to the host.
struct Work {
  std::shared_ptr<Tensor> b;
  std::shared_ptr<Sequence> seq;
};

absl::StatusOr<Work> MakeWork() {
  const std::vector<float> a_values = {1, 2, 3};
  const std::vector<float> zeros = {0, 0, 0};
  absl::StatusOr<std::shared_ptr<Tensor>> a = Tensor::Create(
      TestDevice(), ElementType::kFloat32, 3, 0, MemoryType::kDevice, a_values.data());
  if (!a.ok()) return a.status();
  absl::StatusOr<std::shared_ptr<Tensor>> b =
      Tensor::Create(TestDevice(), ElementType::kFloat32, 3, 0, MemoryType::kDevice, zeros.data());
  if (!b.ok()) return b.status();
  AlgorithmSpec spec;
  spec.tensors = {*a, *b};
  spec.spirv = Spirv(kAddShader);
  spec.workgroup = {3, 1, 1};
  absl::StatusOr<std::shared_ptr<Algorithm>> add = Algorithm::Create(TestDevice(), spec);
  if (!add.ok()) return add.status();
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
  if (!seq.ok()) return seq.status();
  Work w;
  w.b = *b;
  w.seq = *std::move(seq);
  if (absl::Status s = w.seq->Record(op::Dispatch{*add}); !s.ok()) return s;
  if (absl::Status s = w.seq->Record(op::SyncToHost{{w.b}}); !s.ok()) return s;
  return w;
}

// Collects the callback's status.
struct Done {
  absl::Notification notification;
  absl::Status status;
  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status s) {
      status = std::move(s);
      notification.Notify();
    };
  }
  bool Wait() { return notification.WaitForNotificationWithTimeout(kTimeout); }
};

TEST(CompletionWaiter, IdleSequenceIsDoneAtOnce) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice()));
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork());
  Done done;
  waiter->Watch(w.seq, absl::Now() + kTimeout, done.Callback());
  // Called before Watch returned.
  EXPECT_TRUE(done.notification.HasBeenNotified());
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(waiter->pending(), 0u);
}

TEST(CompletionWaiter, CallsBackWhenComplete) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice()));
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork());
  ASSERT_OK(w.seq->Submit());
  Done done;
  waiter->Watch(w.seq, absl::Now() + kTimeout, done.Callback());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status.ok()) << done.status;
  // The host steps ran: the sequence is idle and its results are on the host.
  EXPECT_FALSE(w.seq->IsRunning());
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(1, 2, 3));
  // And again, with the same sequence.
  ASSERT_OK(w.seq->Submit());
  Done again;
  waiter->Watch(w.seq, absl::Now() + kTimeout, again.Callback());
  ASSERT_TRUE(again.Wait());
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(2, 4, 6));
}

// The callbacks run on the waiter's own thread, named for what it does (top -H, perf and gdb show
// it).
TEST(CompletionWaiter, CallsBackOnItsNamedThread) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice()));
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork());
  ASSERT_OK(w.seq->Submit());
  char name[16] = {};
  absl::Notification called;
  waiter->Watch(w.seq, absl::Now() + kTimeout, [&](absl::Status) {
    pthread_getname_np(pthread_self(), name, sizeof(name));
    called.Notify();
  });
  ASSERT_TRUE(called.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_STREQ(name, "kd-waiter");
}

// Eight submissions watched at once all complete, each with its results. `together`: made in one
// vkQueueSubmit (Sequence::SubmitTogether), where only the last one has a fence.
void ExpectManyComplete(CompletionWaiter* waiter, int kCount = 8, bool together = false) {
  std::vector<Work> works;
  std::vector<std::unique_ptr<Done>> dones;
  for (int i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(Work w, MakeWork());
    works.push_back(std::move(w));
    dones.push_back(std::make_unique<Done>());
  }
  if (together) {
    std::vector<Sequence::Submission> batch;
    for (const Work& w : works) batch.push_back({w.seq.get()});
    for (const absl::Status& s : Sequence::SubmitTogether(batch)) ASSERT_OK(s);
    ASSERT_EQ(works.front().seq->InFlight().fence, VK_NULL_HANDLE);
  }
  for (int i = 0; i < kCount; ++i) {
    if (!together) ASSERT_OK(works[i].seq->Submit());
    waiter->Watch(works[i].seq, absl::Now() + kTimeout, dones[i]->Callback());
  }
  for (int i = 0; i < kCount; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(dones[i]->Wait());
    EXPECT_TRUE(dones[i]->status.ok()) << dones[i]->status;
    EXPECT_THAT(HostFloats(*works[i].b), ElementsAre(1, 2, 3));
  }
  EXPECT_EQ(waiter->pending(), 0u);
}

TEST(CompletionWaiter, ManySubmissions) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice()));
  ExpectManyComplete(waiter.get());
}

// Polling before each block (as the daemon's waiters do on GPUs) completes them alike.
TEST(CompletionWaiter, ManySubmissionsWhilePolling) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice(), absl::Microseconds(200)));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    ExpectManyComplete(waiter.get());
  }
}

// Spread over several lanes (as the queues of a GPU are), waited on together with the wake-up
// semaphore: each lane's submissions complete, and so do those watched while the thread blocks.
TEST(CompletionWaiter, ManySubmissionsInSeveralLanes) {
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Microseconds(200)}) {
    SCOPED_TRACE(absl::FormatDuration(spin));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                         CompletionWaiter::Create(TestDevice(), spin, /*test_lanes=*/3));
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(round);
      ExpectManyComplete(waiter.get());
    }
  }
}

// Submitted in one vkQueueSubmit, followed through their timeline semaphores but the last: each
// completes with its results, polled or not.
TEST(CompletionWaiter, SubmissionsMadeTogether) {
  if (!TestDevice()->timeline_supported()) GTEST_SKIP() << "no timeline semaphores";
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Microseconds(200)}) {
    SCOPED_TRACE(absl::FormatDuration(spin));
    for (size_t lanes : {size_t{0}, size_t{3}}) {  // the device's lanes, and three in turn
      SCOPED_TRACE(lanes);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                           CompletionWaiter::Create(TestDevice(), spin, lanes));
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE(round);
        ExpectManyComplete(waiter.get(), 8, /*together=*/true);
      }
    }
  }
}

// More submissions in flight in a lane than one pass of the waiter checks: each pass takes the
// lane's first ones, the next pass those after them, and all complete.
TEST(CompletionWaiter, MoreSubmissionsInALaneThanOnePassChecks) {
  for (size_t lanes : {size_t{1}, size_t{3}}) {
    SCOPED_TRACE(lanes);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                         CompletionWaiter::Create(TestDevice(), absl::ZeroDuration(), lanes));
    ExpectManyComplete(waiter.get(), 150);
  }
}

// A submission whose deadline has passed is refused or completed, while one watched before it
// with a later deadline is left to complete: the deadlines are looked at again once the earliest
// has passed, and only the passed ones are refused.
TEST(CompletionWaiter, PassedDeadlineLeavesALaterOneRunning) {
  for (size_t lanes : {size_t{1}, size_t{3}}) {
    SCOPED_TRACE(lanes);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                         CompletionWaiter::Create(TestDevice(), absl::ZeroDuration(), lanes));
    ASSERT_OK_AND_ASSIGN(Work later, MakeWork());
    ASSERT_OK_AND_ASSIGN(Work passed, MakeWork());
    ASSERT_OK(later.seq->Submit());
    ASSERT_OK(passed.seq->Submit());
    Done later_done, passed_done;
    waiter->Watch(later.seq, absl::Now() + kTimeout, later_done.Callback());
    waiter->Watch(passed.seq, absl::InfinitePast(), passed_done.Callback());
    ASSERT_TRUE(passed_done.Wait());
    ASSERT_TRUE(later_done.Wait());
    EXPECT_THAT(passed_done.status, AnyOf(StatusIs(absl::StatusCode::kOk),
                                          StatusIs(absl::StatusCode::kDeadlineExceeded)));
    EXPECT_TRUE(later_done.status.ok()) << later_done.status;
    EXPECT_THAT(HostFloats(*later.b), ElementsAre(1, 2, 3));
    if (!passed_done.status.ok()) ASSERT_OK(passed.seq->Wait(absl::Seconds(30)));
    EXPECT_EQ(waiter->pending(), 0u);
  }
}

// Watched in another order than they were submitted: each lane keeps submission order
// (Completion::order), so the earlier one is not held behind the later, and both complete.
TEST(CompletionWaiter, SubmissionsWatchedOutOfOrderComplete) {
  for (size_t lanes : {size_t{1}, size_t{3}}) {
    SCOPED_TRACE(lanes);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                         CompletionWaiter::Create(TestDevice(), absl::ZeroDuration(), lanes));
    ASSERT_OK_AND_ASSIGN(Work first, MakeWork());
    ASSERT_OK_AND_ASSIGN(Work second, MakeWork());
    ASSERT_OK(first.seq->Submit());
    ASSERT_OK(second.seq->Submit());
    EXPECT_LT(first.seq->InFlight().order, second.seq->InFlight().order);
    Done first_done, second_done;
    waiter->Watch(second.seq, absl::Now() + kTimeout, second_done.Callback());
    waiter->Watch(first.seq, absl::Now() + kTimeout, first_done.Callback());
    ASSERT_TRUE(first_done.Wait());
    ASSERT_TRUE(second_done.Wait());
    EXPECT_TRUE(first_done.status.ok()) << first_done.status;
    EXPECT_TRUE(second_done.status.ok()) << second_done.status;
    EXPECT_THAT(HostFloats(*first.b), ElementsAre(1, 2, 3));
    EXPECT_THAT(HostFloats(*second.b), ElementsAre(1, 2, 3));
    EXPECT_EQ(waiter->pending(), 0u);
  }
}

class DeadlinePassed : public ::testing::TestWithParam<size_t> {};

TEST_P(DeadlinePassed, RefusedAndLeftRunning) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                       CompletionWaiter::Create(TestDevice(), absl::ZeroDuration(), GetParam()));
  std::shared_ptr<Device> device = TestDevice();
  const bool cpu = device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const std::vector<float> zero = {0};
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> out,
      Tensor::Create(device, ElementType::kFloat32, 1, 0, MemoryType::kDevice, zero.data()));
  AlgorithmSpec spec;
  spec.tensors = {out};
  spec.spirv = Spirv(kBusyShader);
  const uint32_t* max = device->limits().maxComputeWorkGroupCount;
  spec.workgroup =
      cpu ? Workgroup{std::min<uint32_t>(max[0], 16384), 1, 1}
          : Workgroup{std::min<uint32_t>(max[0], 65535), std::min<uint32_t>(max[1], 64), 1};
  const uint32_t iterations = cpu ? 256 : 4096;
  spec.push_constants.resize(4);
  std::memcpy(spec.push_constants.data(), &iterations, 4);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> busy, Algorithm::Create(device, spec));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{busy}));
  ASSERT_OK(seq->Submit());
  Done done;
  waiter->Watch(seq, absl::InfinitePast(), done.Callback());
  ASSERT_TRUE(done.Wait());
  EXPECT_THAT(done.status, AnyOf(StatusIs(absl::StatusCode::kOk),
                                 StatusIs(absl::StatusCode::kDeadlineExceeded)));
  if (absl::IsDeadlineExceeded(done.status)) {
    // The submission stays in flight, for the owner to wait for.
    EXPECT_TRUE(seq->IsRunning());
    ASSERT_OK(seq->Wait(absl::Seconds(30)));
  }
  EXPECT_FALSE(seq->IsRunning());
}

INSTANTIATE_TEST_SUITE_P(CompletionWaiter, DeadlinePassed, ::testing::Values(0, 3),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("OneLane")
                                                  : absl::StrCat(info.param, "Lanes");
                         });

TEST(CompletionWaiter, DestructionCompletesWatched) {
  ASSERT_OK_AND_ASSIGN(Work w, MakeWork());
  Done done;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<CompletionWaiter> waiter,
                         CompletionWaiter::Create(TestDevice()));
    ASSERT_OK(w.seq->Submit());
    waiter->Watch(w.seq, absl::Now() + kTimeout, done.Callback());
  }
  EXPECT_TRUE(done.notification.HasBeenNotified());
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_THAT(HostFloats(*w.b), ElementsAre(1, 2, 3));
}

}  // namespace
}  // namespace komputed::core
