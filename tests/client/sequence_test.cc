// Sequences: record once and evaluate many times, barriers, timestamps, asynchronous evaluation,
// several queues.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "kp_test.h"

namespace kptest {
namespace {

constexpr char kIncrement[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer Data { float v[]; };
  void main() { v[gl_GlobalInvocationID.x] += 1.0; }
)";

TEST_P(KpTest, RecordOnceEvalManyTimes) {
  auto t = mgr().tensor({0, 10, 20});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{t});
  EXPECT_TRUE(seq->isRecording());
  float* host = t->data();
  for (int i = 1; i <= 5; ++i) {
    seq->eval();
    EXPECT_FALSE(seq->isRecording());
    EXPECT_EQ(t->vector(), (std::vector<float>{0.0f + i, 10.0f + i, 20.0f + i})) << "eval " << i;
  }
  EXPECT_EQ(t->data(), host);  // the host data stays where it was
}

// Host-side steps run on every evaluation: a copy refreshes its destinations' host data.
TEST_P(KpTest, CopyHostStepRunsOnEveryEval) {
  auto src = mgr().tensor({1, 2});
  auto dst = mgr().tensor({0, 0});
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorSyncDevice>(TensorList{src})
      ->record<kp::OpTensorCopy>(TensorList{src, dst});
  seq->eval();
  EXPECT_EQ(dst->vector(), (std::vector<float>{1, 2}));
  src->setData({3, 4});
  seq->eval();
  EXPECT_EQ(dst->vector(), (std::vector<float>{3, 4}));
  dst->setData({0, 0});
  seq->eval<kp::OpTensorSyncLocal>(TensorList{dst});
  EXPECT_EQ(dst->vector(), (std::vector<float>{3, 4}));
}

TEST_P(KpTest, BeginAndEndBracketRecording) {
  auto t = mgr().tensor({0});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence();
  seq->begin();
  seq->record<kp::OpAlgoDispatch>(algo);
  seq->record<kp::OpTensorSyncLocal>(TensorList{t});
  EXPECT_TRUE(seq->isRecording());
  seq->end();
  EXPECT_FALSE(seq->isRecording());
  seq->eval();
  EXPECT_EQ(t->vector(), std::vector<float>{1});
  seq->evalAsync();
  EXPECT_KP_ERROR(kFailedPrecondition, seq->begin());
  seq->evalAwait();
  EXPECT_EQ(t->vector(), std::vector<float>{2});

  // A record after end() begins a new batch, as Kompute's record begins a new command buffer.
  seq->record<kp::OpAlgoDispatch>(algo);
  seq->end();
  seq->record<kp::OpTensorSyncLocal>(TensorList{t});
  seq->eval();
  EXPECT_EQ(t->vector(), std::vector<float>{2});  // the dispatch was dropped
  // rerecord() records every operation since the last clear again, the dispatch included.
  seq->rerecord();
  seq->eval();
  EXPECT_EQ(t->vector(), std::vector<float>{4});
}

// Two sequences in flight on the same queue both finish, awaited in either order.
TEST_P(KpTest, TwoSequencesInFlightOnOneQueue) {
  auto a = mgr().tensor({0, 0});
  auto b = mgr().tensor({10, 10});
  std::vector<uint32_t> spirv = kp::compileSource(kIncrement);
  auto inc_a = mgr().algorithm({a}, spirv);
  auto inc_b = mgr().algorithm({b}, spirv);
  auto sa = mgr().sequence();
  auto sb = mgr().sequence();
  sa->record<kp::OpAlgoDispatch>(inc_a)->record<kp::OpTensorSyncLocal>(TensorList{a});
  sb->record<kp::OpAlgoDispatch>(inc_b)->record<kp::OpTensorSyncLocal>(TensorList{b});
  for (int i = 1; i <= 3; ++i) {
    sa->evalAsync();
    sb->evalAsync();
    if (i % 2) {
      sb->evalAwait();
      sa->evalAwait();
    } else {
      sa->evalAwait();
      sb->evalAwait();
    }
    EXPECT_EQ(a->vector(), (std::vector<float>{1.0f * i, 1.0f * i}));
    EXPECT_EQ(b->vector(), (std::vector<float>{10.0f + i, 10.0f + i}));
  }
}

TEST_P(KpTest, EvalOfAnOpReplacesWhatWasRecorded) {
  auto t = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo);
  EXPECT_TRUE(seq->isRecording());
  seq->eval<kp::OpTensorSyncLocal>(TensorList{t});  // the dispatch is dropped
  EXPECT_EQ(t->vector(), (std::vector<float>{0, 0}));

  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{t});
  seq->clear();  // drops the operations, but (Kompute 0.9) the commands recorded still run
  EXPECT_FALSE(seq->isRecording());
  seq->eval();
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 1}));

  seq->eval<kp::OpAlgoDispatch>(algo);  // a new batch
  seq->eval<kp::OpTensorSyncLocal>(TensorList{t});
  EXPECT_EQ(t->vector(), (std::vector<float>{2, 2}));
}

// Many sequences that live for one evaluation each (as `mgr.sequence()->eval<...>(...)` makes),
// with the host reusing the memory they freed. Runs in a child process so that a crash fails only
// this test.
// A regression test: Mesa 22.3's lavapipe queue thread can still be signalling a sequence's
// timeline semaphore after its fence has signalled, so Sequence::~Sequence waits for the
// semaphore's last value before destroying it (without that wait, an invalid read in
// libvulkan_lvp.so crashed this test).
TEST_P(KpTest, ShortLivedSequences) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto t = mgr().tensor({0});
        auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
        for (int i = 0; i < 200; ++i) {
          mgr().sequence()->record<kp::OpAlgoDispatch>(algo)->eval();
          std::vector<std::unique_ptr<char[]>> churn;  // reuse what was just freed
          for (int k = 0; k < 32; ++k) churn.emplace_back(new char[232]());
        }
        mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{t});
        std::exit(t->vector() == std::vector<float>{200} ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

// a -> b -> a -> b, each step doubling, with a barrier before each read of what the last step
// wrote.
TEST_P(KpTest, DispatchChainWithMemoryBarriers) {
  constexpr char kDouble[] = R"(
    #version 450
    layout(local_size_x = 64) in;
    layout(set = 0, binding = 0) buffer In { float in_v[]; };
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = in_v[i] * 2.0; }
  )";
  constexpr uint32_t kSize = 64 * 64;
  std::vector<float> data(kSize);
  std::iota(data.begin(), data.end(), 0.0f);
  auto a = mgr().tensor(data);
  auto b = mgr().tensor(std::vector<float>(kSize, 0.0f));
  std::vector<uint32_t> spirv = kp::compileSource(kDouble);
  const kp::Workgroup wg = {kSize / 64, 1, 1};
  auto a_to_b = mgr().algorithm({a, b}, spirv, wg);
  auto b_to_a = mgr().algorithm({b, a}, spirv, wg);
  auto barrier = [](const std::shared_ptr<kp::Tensor>& t) {
    return std::make_shared<kp::OpMemoryBarrier>(
        TensorList{t}, vk::AccessFlagBits::eShaderWrite, vk::AccessFlagBits::eShaderRead,
        vk::PipelineStageFlagBits::eComputeShader, vk::PipelineStageFlagBits::eComputeShader);
  };
  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(a_to_b)
      ->record(barrier(b))
      ->record<kp::OpAlgoDispatch>(b_to_a)
      ->record(barrier(a))
      ->record<kp::OpAlgoDispatch>(a_to_b)
      ->record<kp::OpTensorSyncLocal>(TensorList{a, b})
      ->eval();
  std::vector<float> times4(kSize), times8(kSize);
  for (uint32_t i = 0; i < kSize; ++i) times4[i] = data[i] * 4, times8[i] = data[i] * 8;
  EXPECT_EQ(a->vector(), times4);
  EXPECT_EQ(b->vector(), times8);
}

TEST_P(KpTest, TimestampsBracketEveryOp) {
  if (!mgr().getDeviceProperties().limits.timestampComputeAndGraphics) {
    GTEST_SKIP() << "the device has no timestamps (timestampComputeAndGraphics is false)";
  }
  auto t = mgr().tensor({1, 2, 3});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence(0, 10);
  EXPECT_TRUE(seq->getTimestamps().empty());
  seq->record<kp::OpTensorSyncDevice>(TensorList{t})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{t});
  for (int eval = 0; eval < 2; ++eval) {  // the second evaluation gets fresh timestamps
    seq->eval();
    std::vector<uint64_t> ts = seq->getTimestamps();
    ASSERT_EQ(ts.size(), 4u) << "eval " << eval;
    EXPECT_TRUE(std::is_sorted(ts.begin(), ts.end())) << "eval " << eval;
    EXPECT_GT(ts.front(), 0u);
  }
  EXPECT_EQ(t->vector(), (std::vector<float>{3, 4, 5}));  // two increments

  // Fewer timestamps than ops + 1: the first ones only.
  auto short_seq = mgr().sequence(0, 2);
  short_seq->record<kp::OpTensorSyncDevice>(TensorList{t})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{t})
      ->eval();
  std::vector<uint64_t> ts = short_seq->getTimestamps();
  EXPECT_EQ(ts.size(), 2u);
  EXPECT_TRUE(std::is_sorted(ts.begin(), ts.end()));
}

// Each invocation runs an LCG 64 times over its element, in place.
constexpr char kLcg[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0) buffer Data { uint v[]; };
  void main() {
    uint i = gl_GlobalInvocationID.x;
    uint x = v[i];
    for (uint k = 0u; k < 64u; ++k) x = x * 1664525u + 1013904223u;
    v[i] = x;
  }
)";

uint32_t Lcg(uint32_t x, int times) {
  for (int k = 0; k < times; ++k) x = x * 1664525u + 1013904223u;
  return x;
}

TEST_P(KpTest, EvalAsyncThenAwait) {
  // Enough work to take a while on a CPU device: 2^18 invocations, 4 dispatches.
  constexpr uint32_t kSize = 1u << 18;
  constexpr int kDispatches = 4;
  std::vector<uint32_t> data(kSize);
  std::iota(data.begin(), data.end(), 0u);
  auto t = mgr().tensorT<uint32_t>(data);
  auto algo = mgr().algorithm({t}, kp::compileSource(kLcg), kp::Workgroup({kSize / 64, 1, 1}));
  auto seq = mgr().sequence();
  seq->evalAwait();  // nothing in flight: returns
  for (int d = 0; d < kDispatches; ++d) {
    if (d > 0) {
      seq->record<kp::OpMemoryBarrier>(
          TensorList{t}, vk::AccessFlagBits::eShaderWrite,
          vk::AccessFlagBits::eShaderRead | vk::AccessFlagBits::eShaderWrite,
          vk::PipelineStageFlagBits::eComputeShader, vk::PipelineStageFlagBits::eComputeShader);
    }
    seq->record<kp::OpAlgoDispatch>(algo);
  }
  seq->record<kp::OpTensorSyncLocal>(TensorList{t});

  seq->evalAsync();
  EXPECT_TRUE(seq->isRunning());  // until awaited
  // A running sequence can be neither recorded nor evaluated again.
  EXPECT_KP_ERROR(kFailedPrecondition, seq->record<kp::OpTensorSyncLocal>(TensorList{t}));
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->evalAsync());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->rerecord());

  // evalAwaitFor reports whether the wait ran out of time; either way nothing is thrown.
  const bool finished = seq->evalAwaitFor(1);  // 1 ns
  EXPECT_EQ(seq->isRunning(), !finished);
  RecordProperty("await_1ns_timed_out", finished ? "no" : "yes");

  seq->evalAwait();
  EXPECT_FALSE(seq->isRunning());
  seq->evalAwait();  // again: nothing in flight

  std::vector<uint32_t> got = t->vector();
  ASSERT_EQ(got.size(), kSize);
  size_t wrong = 0;
  for (uint32_t i = 0; i < kSize; ++i) {
    if (got[i] != Lcg(i, 64 * kDispatches)) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "e.g. element 1: " << got[1] << " vs " << Lcg(1, 64 * kDispatches);

  // The sequence evaluates again afterwards.
  seq->eval();
  EXPECT_EQ(t->vector()[5], Lcg(5, 2 * 64 * kDispatches));
}

// Kompute programs poll: `while (sq->isRunning()) sq->evalAwait(1);` returns the still-running
// sequence on each timeout (no error) and ends once the work has completed and its host steps ran.
TEST_P(KpTest, PollingWithEvalAwaitUntilDone) {
  constexpr uint32_t kSize = 1u << 18;
  std::vector<uint32_t> data(kSize);
  std::iota(data.begin(), data.end(), 0u);
  auto t = mgr().tensorT<uint32_t>(data);
  auto copy = mgr().tensorT<uint32_t>(kSize);
  auto algo = mgr().algorithm({t}, kp::compileSource(kLcg), kp::Workgroup({kSize / 64, 1, 1}));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{t})
      ->record<kp::OpTensorCopy>(TensorList{t, copy});

  seq->evalAsync();
  uint64_t polls = 0;
  while (seq->isRunning()) {
    EXPECT_EQ(seq->evalAwait(1), seq);
    ++polls;
  }
  RecordProperty("polls", std::to_string(polls));
  EXPECT_EQ(t->vector()[7], Lcg(7, 64));
  EXPECT_EQ(copy->vector()[7], Lcg(7, 64));  // the copy's host step ran

  // The same with the call that reports the timeout.
  seq->evalAsync();
  while (!seq->evalAwaitFor(1)) EXPECT_TRUE(seq->isRunning());
  EXPECT_FALSE(seq->isRunning());
  EXPECT_TRUE(seq->evalAwaitFor(1));  // nothing in flight
  std::vector<uint32_t> got = t->vector();
  size_t wrong = 0;
  for (uint32_t i = 0; i < kSize; ++i) {
    if (got[i] != Lcg(i, 2 * 64)) ++wrong;
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(copy->vector(), got);
}

// Kompute 0.9's clear() drops the operations but keeps the commands recorded: clear() then
// evalAsync() runs them (without the operations' host steps) until the next record begins anew.
TEST_P(KpTest, ClearThenEvalAsyncRunsTheRecordedCommands) {
  auto a = mgr().tensor({1, 2, 3});
  auto copy = mgr().tensor({0, 0, 0});
  auto t = mgr().tensor({0, 10, 20});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorSyncDevice>(TensorList{a, t})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorCopy>(TensorList{a, copy})
      ->record<kp::OpTensorSyncLocal>(TensorList{t});
  EXPECT_TRUE(seq->isRecording());
  EXPECT_FALSE(seq->isRunning());
  seq->clear();
  EXPECT_FALSE(seq->isRecording());
  EXPECT_FALSE(seq->isRunning());
  seq->evalAsync();
  EXPECT_FALSE(seq->isRecording());
  EXPECT_TRUE(seq->isRunning());
  seq->evalAwait();
  EXPECT_FALSE(seq->isRecording());
  EXPECT_FALSE(seq->isRunning());
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 11, 21}));   // the dispatch and the sync ran
  EXPECT_EQ(copy->vector(), (std::vector<float>{0, 0, 0}));  // the copy's host step did not
  seq->eval();                                               // and again
  EXPECT_EQ(t->vector(), (std::vector<float>{2, 12, 22}));

  // The next record begins a new batch: the dispatch is gone.
  seq->record<kp::OpTensorSyncLocal>(TensorList{t, copy});
  EXPECT_TRUE(seq->isRecording());
  seq->eval();
  seq->eval();
  EXPECT_EQ(t->vector(), (std::vector<float>{2, 12, 22}));
  EXPECT_EQ(copy->vector(), (std::vector<float>{1, 2, 3}));  // the copy ran on the device
}

// end(), begin(), record and eval of a running sequence throw, as in Kompute; once awaited, they
// work again.
TEST_P(KpTest, EndWhileRunningThrows) {
  auto t = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({t}, kp::compileSource(kIncrement));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{t});
  seq->evalAsync();
  EXPECT_TRUE(seq->isRunning());  // until awaited, whether or not the device has finished
  EXPECT_KP_ERROR(kFailedPrecondition, seq->end());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->begin());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->clear());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->record<kp::OpTensorSyncLocal>(TensorList{t}));
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->evalAsync());
  EXPECT_TRUE(seq->isRunning());
  seq->evalAwait();
  EXPECT_FALSE(seq->isRunning());
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 1}));
  seq->end();
  seq->begin();
  seq->eval();  // nothing refused above was recorded
  EXPECT_EQ(t->vector(), (std::vector<float>{2, 2}));
}

// Sequences on two queues of one family both complete (only where the family has two queues).
TEST_P(KpTest, SequencesOnTwoQueues) {
  std::unique_ptr<kp::Manager> mgr2;
  try {
    mgr2 = MakeManager(GetParam(), 0, {0, 0});
  } catch (const kp::Error& e) {
    if (e.code() != kp::ErrorCode::kInvalidArgument) throw;
    GTEST_SKIP() << "device 0 has no two compute queues in family 0: " << e.what();
  }
  constexpr uint32_t kSize = 1u << 14;
  std::vector<uint32_t> data(kSize);
  std::iota(data.begin(), data.end(), 0u);
  auto t0 = mgr2->tensorT<uint32_t>(data);
  auto t1 = mgr2->tensorT<uint32_t>(data);
  std::vector<uint32_t> spirv = kp::compileSource(kLcg);
  auto a0 = mgr2->algorithm({t0}, spirv, kp::Workgroup({kSize / 64, 1, 1}));
  auto a1 = mgr2->algorithm({t1}, spirv, kp::Workgroup({kSize / 64, 1, 1}));
  auto s0 = mgr2->sequence(0);
  auto s1 = mgr2->sequence(1);
  s0->record<kp::OpAlgoDispatch>(a0)->record<kp::OpTensorSyncLocal>(TensorList{t0});
  s1->record<kp::OpAlgoDispatch>(a1)->record<kp::OpTensorSyncLocal>(TensorList{t1});
  s0->evalAsync();
  s1->evalAsync();
  s1->evalAwait();
  s0->evalAwait();
  EXPECT_EQ(t0->vector()[kSize - 1], Lcg(kSize - 1, 64));
  EXPECT_EQ(t1->vector()[7], Lcg(7, 64));
  EXPECT_KP_ERROR(kInvalidArgument, mgr2->sequence(2));
}

// A barrier whose access masks do not suit its stages is refused when it is recorded.
TEST_P(KpTest, BarrierWithMismatchedMasksIsRefused) {
  auto t = mgr().tensor({1, 2});
  auto seq = mgr().sequence();
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMemoryBarrier>(TensorList{t}, vk::AccessFlagBits::eShaderWrite,
                                                   vk::AccessFlagBits::eShaderRead,
                                                   vk::PipelineStageFlagBits::eTransfer,
                                                   vk::PipelineStageFlagBits::eComputeShader));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMemoryBarrier>(TensorList{t}, vk::AccessFlagBits::eShaderWrite,
                                                   vk::AccessFlagBits::eColorAttachmentRead,
                                                   vk::PipelineStageFlagBits::eComputeShader,
                                                   vk::PipelineStageFlagBits::eFragmentShader));
  // The sequence still records and runs.
  seq->record<kp::OpTensorSyncDevice>(TensorList{t})
      ->record<kp::OpMemoryBarrier>(
          TensorList{t}, vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eShaderRead,
          vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eComputeShader)
      ->record<kp::OpTensorSyncLocal>(TensorList{t})
      ->eval();
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace kptest
