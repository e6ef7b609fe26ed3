// Algorithms: push and specialization constants, workgroups, rebuild, the built-in OpMult.
#include <algorithm>
#include <chrono>
#include <climits>

#include "kp_test.h"

namespace kptest {
namespace {

using MemoryType = kp::Tensor::TensorTypes;

// Runs `algo` once and brings `outputs` back to the host.
void RunOnce(kp::Manager& mgr, const std::shared_ptr<kp::Algorithm>& algo,
             const TensorList& outputs) {
  mgr.sequence()->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(outputs)->eval();
}

TEST_P(KpTest, IntPushConstantsReachTheShader) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { int out_v[]; };
    layout(push_constant) uniform Push { int a; int b; } push;
    void main() { out_v[0] = push.a; out_v[1] = push.b; }
  )";
  auto out = mgr().tensorT<int32_t>({0, 0});
  auto algo = mgr().algorithm<float, int32_t>({out}, kp::compileSource(kShader), {1, 1, 1}, {},
                                              {-7, INT_MAX});
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<int32_t>{-7, INT_MAX}));

  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo, std::vector<int32_t>{INT_MIN, 42})
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<int32_t>{INT_MIN, 42}));
  EXPECT_EQ(algo->getPushConstants<int32_t>(), (std::vector<int32_t>{INT_MIN, 42}));
}

TEST_P(KpTest, UintPushConstantsAbove2To31) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
    layout(push_constant) uniform Push { uint a; uint b; } push;
    void main() { out_v[0] = push.a; out_v[1] = push.b + 1u; }
  )";
  auto out = mgr().tensorT<uint32_t>({0, 0});
  auto algo = mgr().algorithm<float, uint32_t>({out}, kp::compileSource(kShader), {1, 1, 1}, {},
                                               {3000000000u, 4294967294u});
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<uint32_t>{3000000000u, 4294967295u}));

  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo, std::vector<uint32_t>{2147483648u, 4000000000u})
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<uint32_t>{2147483648u, 4000000001u}));
}

TEST_P(KpTest, DoublePushConstantsKeepDoublePrecision) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { double out_v[]; };
    layout(push_constant) uniform Push { double a; double b; } push;
    void main() { out_v[0] = push.a; out_v[1] = push.a * push.b; }
  )";
  auto out = mgr().tensorT<double>({0, 0});
  std::vector<uint32_t> spirv = kp::compileSource(kShader);
  std::shared_ptr<kp::Algorithm> algo;
  try {
    algo = mgr().algorithm<float, double>({out}, spirv, {1, 1, 1}, {}, {1.0000000001, 2.0});
  } catch (const kp::Error& e) {
    GTEST_SKIP() << "the device cannot run float64 shaders (shaderFloat64): " << e.what();
  }
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<double>{1.0000000001, 2.0000000002}));

  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo, std::vector<double>{-3.141592653589793, 1e-300})
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector()[0], -3.141592653589793);
  EXPECT_DOUBLE_EQ(out->vector()[1], -3.141592653589793e-300);
}

struct MixedPush {
  float a;
  uint32_t b;
  int32_t c;
};

constexpr char kMixedShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer OutF { float out_f[]; };
  layout(set = 0, binding = 1) buffer OutU { uint out_u[]; };
  layout(set = 0, binding = 2) buffer OutI { int out_i[]; };
  layout(push_constant) uniform Push { float a; uint b; int c; } push;
  void main() { out_f[0] = push.a; out_u[0] = push.b; out_i[0] = push.c; }
)";

TEST_P(KpTest, StructPushConstantsWithAndWithoutOverride) {
  auto out_f = mgr().tensor({0});
  auto out_u = mgr().tensorT<uint32_t>(std::vector<uint32_t>{0});
  auto out_i = mgr().tensorT<int32_t>(std::vector<int32_t>{0});
  TensorList outs = {out_f, out_u, out_i};
  auto algo = mgr().algorithm<float, MixedPush>(outs, kp::compileSource(kMixedShader), {1, 1, 1},
                                                {}, {MixedPush{1.5f, 3000000000u, -42}});
  auto expect = [&](float a, uint32_t b, int32_t c) {
    EXPECT_EQ(out_f->vector(), std::vector<float>{a});
    EXPECT_EQ(out_u->vector(), std::vector<uint32_t>{b});
    EXPECT_EQ(out_i->vector(), std::vector<int32_t>{c});
  };

  RunOnce(mgr(), algo, outs);
  expect(1.5f, 3000000000u, -42);

  // Override at dispatch.
  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo, std::vector<MixedPush>{{-0.25f, 7u, 2000000000}})
      ->record<kp::OpTensorSyncLocal>(outs)
      ->eval();
  expect(-0.25f, 7u, 2000000000);
  std::vector<MixedPush> now = algo->getPushConstants<MixedPush>();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].a, -0.25f);
  EXPECT_EQ(now[0].b, 7u);
  EXPECT_EQ(now[0].c, 2000000000);

  // The override persists: a later dispatch without one uses it (outputs zeroed first).
  out_f->setData({0});
  out_u->setData({0});
  out_i->setData({0});
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(outs)
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(outs)
      ->eval();
  expect(-0.25f, 7u, 2000000000);

  // setPushConstants (typed and raw) affects dispatches recorded afterwards.
  algo->setPushConstants(std::vector<MixedPush>{{8.0f, 9u, -10}});
  RunOnce(mgr(), algo, outs);
  expect(8.0f, 9u, -10);
  MixedPush raw{0.125f, 4294967295u, INT_MIN};
  algo->setPushConstants(&raw, 1, sizeof(MixedPush));
  RunOnce(mgr(), algo, outs);
  expect(0.125f, 4294967295u, INT_MIN);
}

// out_v[0] = the push constant.
constexpr char kPushValueShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer Out { float out_v[]; };
  layout(push_constant) uniform Push { float v; } push;
  void main() { out_v[0] = push.v; }
)";

// As in Kompute, a dispatch takes the push constants current when it is recorded.
TEST_P(KpTest, PushConstantsAreTakenWhenRecorded) {
  auto out = mgr().tensor({0});
  auto algo = mgr().algorithm({out}, kp::compileSource(kPushValueShader), {1, 1, 1},
                              std::vector<float>{}, std::vector<float>{1});
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{out});
  algo->setPushConstants(std::vector<float>{2});
  seq->eval();
  EXPECT_EQ(out->vector(), std::vector<float>{1});
  seq->rerecord();  // records the dispatch again, with the constants now current
  seq->eval();
  EXPECT_EQ(out->vector(), std::vector<float>{2});
}

// rerecord() replays a dispatch's override, which (as at record time) becomes the algorithm's.
TEST_P(KpTest, RerecordReappliesPushOverrides) {
  auto out = mgr().tensor({0});
  auto algo = mgr().algorithm({out}, kp::compileSource(kPushValueShader), {1, 1, 1},
                              std::vector<float>{}, std::vector<float>{1});
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo, std::vector<float>{3})
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), std::vector<float>{3});
  algo->setPushConstants(std::vector<float>{5});
  EXPECT_EQ(algo->getPushConstants<float>(), std::vector<float>{5});
  seq->rerecord();
  // Core re-applies the override {3} to the algorithm; the facade's copy (getPushConstants) must
  // follow it.
  EXPECT_EQ(algo->getPushConstants<float>(), std::vector<float>{3});
  // What a new dispatch without override uses must agree with getPushConstants().
  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), algo->getPushConstants<float>());
}

TEST_P(KpTest, PushConstantsOfAnotherSizeAreRejected) {
  auto out_f = mgr().tensor({0});
  auto out_u = mgr().tensorT<uint32_t>(std::vector<uint32_t>{0});
  auto out_i = mgr().tensorT<int32_t>(std::vector<int32_t>{0});
  auto algo =
      mgr().algorithm<float, MixedPush>({out_f, out_u, out_i}, kp::compileSource(kMixedShader),
                                        {1, 1, 1}, {}, {MixedPush{1.5f, 3u, -4}});
  auto seq = mgr().sequence();
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpAlgoDispatch>(algo, std::vector<float>{1.0f}));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpAlgoDispatch>(algo, std::vector<float>{1, 2, 3, 4}));
  EXPECT_KP_ERROR(kInvalidArgument, algo->setPushConstants(std::vector<float>{1, 2}));
  auto no_push = mgr().algorithm({out_f, out_u, out_i}, kp::compileSource(kMixedShader));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpAlgoDispatch>(no_push, std::vector<float>{1.0f}));
  EXPECT_KP_ERROR(kInvalidArgument,
                  algo->setPushConstants(std::vector<MixedPush>{{1, 2, 3}, {4, 5, 6}}));
  // Nothing changed.
  std::vector<MixedPush> now = algo->getPushConstants<MixedPush>();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].a, 1.5f);
  EXPECT_EQ(now[0].b, 3u);
  EXPECT_EQ(now[0].c, -4);
  // The same byte size with another element type is accepted (Kompute compares bytes).
  algo->setPushConstants(std::vector<uint32_t>{0x3f800000u, 5u, 6u});
  RunOnce(mgr(), algo, {out_f, out_u, out_i});
  EXPECT_EQ(out_f->vector(), std::vector<float>{1.0f});
  EXPECT_EQ(out_u->vector(), std::vector<uint32_t>{5u});
  EXPECT_EQ(out_i->vector(), std::vector<int32_t>{6});
}

TEST_P(KpTest, FloatSpecializationConstants) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { float out_v[]; };
    layout(constant_id = 0) const float kA = 0;
    layout(constant_id = 1) const float kB = 0;
    void main() { out_v[0] = kA; out_v[1] = kB; out_v[2] = kA * kB; }
  )";
  auto out = mgr().tensor({0, 0, 0});
  auto algo = mgr().algorithm({out}, kp::compileSource(kShader), {1, 1, 1},
                              std::vector<float>{2.5f, -3.75f});
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<float>{2.5f, -3.75f, -9.375f}));
  EXPECT_EQ(algo->getSpecializationConstants<float>(), (std::vector<float>{2.5f, -3.75f}));
}

// Constants not given keep the shader's defaults.
TEST_P(KpTest, MissingSpecializationConstantsKeepDefaults) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { float out_v[]; };
    layout(constant_id = 0) const float kA = 1.0;
    layout(constant_id = 1) const float kB = 7.0;
    void main() { out_v[0] = kA; out_v[1] = kB; }
  )";
  auto out = mgr().tensor({0, 0});
  auto given = mgr().algorithm({out}, kp::compileSource(kShader), {1, 1, 1}, std::vector<float>{4});
  RunOnce(mgr(), given, {out});
  EXPECT_EQ(out->vector(), (std::vector<float>{4, 7}));
  auto none = mgr().algorithm({out}, kp::compileSource(kShader), {1, 1, 1});
  RunOnce(mgr(), none, {out});
  EXPECT_EQ(out->vector(), (std::vector<float>{1, 7}));
}

TEST_P(KpTest, IntSpecializationConstants) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { int out_v[]; };
    layout(constant_id = 0) const int kA = 0;
    layout(constant_id = 1) const int kB = 0;
    void main() { out_v[0] = kA; out_v[1] = kB; out_v[2] = kA * kB; }
  )";
  auto out = mgr().tensorT<int32_t>({0, 0, 0});
  auto algo = mgr().algorithm<int32_t, float>({out}, kp::compileSource(kShader), {1, 1, 1},
                                              std::vector<int32_t>{-5, 2000});
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<int32_t>{-5, 2000, -10000}));
  EXPECT_EQ(algo->getSpecializationConstants<int32_t>(), (std::vector<int32_t>{-5, 2000}));
}

TEST_P(KpTest, MultiDimensionalWorkgroups) {
  constexpr char k2D[] = R"(
    #version 450
    layout(local_size_x = 1, local_size_y = 1) in;
    layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
    void main() {
      uint x = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y;
      out_v[y * 4 + x] = x + 100 * y;
    }
  )";
  auto out = mgr().tensorT<uint32_t>(std::vector<uint32_t>(12, 0xFFFFFFFFu));
  auto algo = mgr().algorithm({out}, kp::compileSource(k2D), kp::Workgroup({4, 3, 1}));
  EXPECT_EQ(algo->getWorkgroup(), (kp::Workgroup{4, 3, 1}));
  RunOnce(mgr(), algo, {out});
  std::vector<uint32_t> expected;
  for (uint32_t y = 0; y < 3; ++y) {
    for (uint32_t x = 0; x < 4; ++x) expected.push_back(x + 100 * y);
  }
  EXPECT_EQ(out->vector(), expected);

  constexpr char k3D[] = R"(
    #version 450
    layout(local_size_x = 1, local_size_y = 1, local_size_z = 1) in;
    layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
    void main() {
      uvec3 g = gl_GlobalInvocationID;
      out_v[g.z * 6 + g.y * 3 + g.x] = g.x + 10 * g.y + 100 * g.z;
    }
  )";
  auto out3 = mgr().tensorT<uint32_t>(std::vector<uint32_t>(12, 0xFFFFFFFFu));
  auto algo3 = mgr().algorithm({out3}, kp::compileSource(k3D), kp::Workgroup({3, 2, 2}));
  RunOnce(mgr(), algo3, {out3});
  expected.clear();
  for (uint32_t z = 0; z < 2; ++z) {
    for (uint32_t y = 0; y < 2; ++y) {
      for (uint32_t x = 0; x < 3; ++x) expected.push_back(x + 10 * y + 100 * z);
    }
  }
  EXPECT_EQ(out3->vector(), expected);
}

TEST_P(KpTest, DefaultWorkgroupIsTheFirstTensorsSize) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
    void main() { out_v[gl_GlobalInvocationID.x] = gl_GlobalInvocationID.x * 3u; }
  )";
  auto out = mgr().tensorT<uint32_t>(size_t{7});
  auto algo = mgr().algorithm({out}, kp::compileSource(kShader));
  EXPECT_EQ(algo->getWorkgroup(), (kp::Workgroup{7, 1, 1}));
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<uint32_t>{0, 3, 6, 9, 12, 15, 18}));
  ASSERT_EQ(algo->getTensors().size(), 1u);
  EXPECT_EQ(algo->getTensors()[0], out);
}

TEST_P(KpTest, WorkgroupYAndZZeroMeanOne) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { uint out_v[]; };
    void main() { out_v[gl_GlobalInvocationID.x] = gl_NumWorkGroups.x * 100u + gl_NumWorkGroups.y * 10u + gl_NumWorkGroups.z; }
  )";
  auto out = mgr().tensorT<uint32_t>(size_t{3});
  auto algo = mgr().algorithm({out}, kp::compileSource(kShader), kp::Workgroup({3, 0, 0}));
  EXPECT_EQ(algo->getWorkgroup(), (kp::Workgroup{3, 1, 1}));
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<uint32_t>{311, 311, 311}));
}

TEST_P(KpTest, EmptyAlgorithmIsNotInitialised) {
  auto algo = mgr().algorithm();
  EXPECT_FALSE(algo->isInit());
  EXPECT_TRUE(algo->getTensors().empty());
  EXPECT_TRUE(algo->getPushConstants<float>().empty());
  EXPECT_KP_ERROR(kFailedPrecondition, algo->setPushConstants(std::vector<float>{1}));
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().sequence()->record<kp::OpAlgoDispatch>(algo));
}

TEST_P(KpTest, RebuiltAlgorithmNeedsRerecord) {
  constexpr char kAddOne[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer In { float in_v[]; };
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = in_v[i] + 1.0; }
  )";
  constexpr char kTimesTen[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer In { float in_v[]; };
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = in_v[i] * 10.0; }
  )";
  auto in = mgr().tensor({1, 2, 3});
  auto in2 = mgr().tensor({4, 5, 6});
  auto out = mgr().tensor({0, 0, 0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kAddOne));
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorSyncDevice>(TensorList{in})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 3, 4}));

  algo->rebuild({in2, out}, kp::compileSource(kTimesTen), kp::Workgroup({2, 1, 1}));
  ASSERT_EQ(algo->getTensors().size(), 2u);
  EXPECT_EQ(algo->getTensors()[0], in2);
  EXPECT_EQ(algo->getWorkgroup(), (kp::Workgroup{2, 1, 1}));
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_FALSE(seq->isRunning());
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 3, 4}));

  seq->rerecord();
  seq->eval();
  // Two workgroups: the third element keeps its old value.
  EXPECT_EQ(out->vector(), (std::vector<float>{40, 50, 4}));
  seq->eval();  // and again, without rerecording
  EXPECT_EQ(out->vector(), (std::vector<float>{40, 50, 4}));
}

TEST_P(KpTest, FailedRebuildLeavesTheAlgorithmWorking) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { float out_v[]; };
    void main() { out_v[gl_GlobalInvocationID.x] += 1.0; }
  )";
  auto out = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({out}, kp::compileSource(kShader));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{out})->eval();
  EXPECT_KP_ERROR(kInvalidArgument, algo->rebuild({out}, std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(algo->isInit());
  seq->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 2}));
}

TEST_P(KpTest, OpMultMultipliesElementwise) {
  auto a = mgr().tensor({1, 2, 3, -4});
  auto b = mgr().tensor({4, 5, 6, 0.5f});
  auto c = mgr().tensor({0, 0, 0, 0});
  auto algo = mgr().algorithm();
  EXPECT_FALSE(algo->isInit());
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{a, b})
      ->record<kp::OpMult>(TensorList{a, b, c}, algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{c})
      ->eval();
  EXPECT_EQ(c->vector(), (std::vector<float>{4, 10, 18, -2}));
  EXPECT_TRUE(algo->isInit());

  auto ia = mgr().tensorT<int32_t>({-3, 7});
  auto ib = mgr().tensorT<int32_t>({5, -6});
  auto ic = mgr().tensorT<int32_t>(size_t{2});
  auto ua = mgr().tensorT<uint32_t>({70000, 3});
  auto ub = mgr().tensorT<uint32_t>({60000, 4});
  auto uc = mgr().tensorT<uint32_t>(size_t{2});
  mgr()
      .sequence()
      ->record<kp::OpMult>(TensorList{ia, ib, ic}, mgr().algorithm())
      ->record<kp::OpMult>(TensorList{ua, ub, uc}, mgr().algorithm())
      ->record<kp::OpTensorSyncLocal>(TensorList{ic, uc})
      ->eval();
  EXPECT_EQ(ic->vector(), (std::vector<int32_t>{-15, -42}));
  EXPECT_EQ(uc->vector(), (std::vector<uint32_t>{4200000000u, 12}));
}

// OpMult dispatches a grid of workgroups within every device's limits (lavapipe's
// maxComputeWorkGroupCount is 65535 per dimension), so it takes any size: 10 million elements of
// each 32-bit type here, every product checked.
TEST_P(KpTest, OpMultOnTenMillionElements) {
  constexpr uint32_t kSize = 10'000'000;
  std::vector<uint32_t> ua(kSize), ub(kSize);
  std::vector<float> fa(kSize), fb(kSize);
  for (uint32_t i = 0; i < kSize; ++i) {
    ua[i] = i * 2654435761u;
    ub[i] = i ^ 0x5bd1e995u;
    fa[i] = static_cast<float>(i % 4096);  // products below 2^24: exact in float
    fb[i] = static_cast<float>((i >> 12) % 4096);
  }
  auto a = mgr().tensorT<uint32_t>(ua);
  auto b = mgr().tensorT<uint32_t>(ub);
  auto c = mgr().tensorT<uint32_t>(size_t{kSize});
  auto x = mgr().tensorT<float>(fa);
  auto y = mgr().tensorT<float>(fb);
  auto z = mgr().tensorT<float>(size_t{kSize});
  const auto start = std::chrono::steady_clock::now();
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{a, b, x, y})
      ->record<kp::OpMult>(TensorList{a, b, c}, mgr().algorithm())
      ->record<kp::OpMult>(TensorList{x, y, z}, mgr().algorithm())
      ->record<kp::OpTensorSyncLocal>(TensorList{c, z})
      ->eval();
  const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  RecordProperty("eval_ms", std::to_string(took.count()));
  const std::vector<uint32_t> got_u = c->vector();
  const std::vector<float> got_f = z->vector();
  ASSERT_EQ(got_u.size(), kSize);
  ASSERT_EQ(got_f.size(), kSize);
  size_t wrong_u = 0, wrong_f = 0, first_u = kSize, first_f = kSize;
  for (uint32_t i = 0; i < kSize; ++i) {
    if (got_u[i] != ua[i] * ub[i] && wrong_u++ == 0) first_u = i;
    if (got_f[i] != fa[i] * fb[i] && wrong_f++ == 0) first_f = i;
  }
  EXPECT_EQ(wrong_u, 0u) << "first wrong uint32 product at " << first_u;
  EXPECT_EQ(wrong_f, 0u) << "first wrong float product at " << first_f;
}

TEST_P(KpTest, OpMultOnDoubles) {
  auto a = mgr().tensorT<double>({1.0000000001, -2});
  auto b = mgr().tensorT<double>({3, 0.25});
  auto c = mgr().tensorT<double>(size_t{2});
  auto seq = mgr().sequence();
  try {
    seq->record<kp::OpMult>(TensorList{a, b, c}, mgr().algorithm());
  } catch (const kp::Error& e) {
    GTEST_SKIP() << "the device cannot run float64 shaders (shaderFloat64): " << e.what();
  }
  seq->record<kp::OpTensorSyncLocal>(TensorList{c})->eval();
  EXPECT_EQ(c->vector(), (std::vector<double>{1.0000000001 * 3, -0.5}));
}

TEST_P(KpTest, OpMultRejectsBadTensorLists) {
  auto a = mgr().tensor({1, 2});
  auto b = mgr().tensor({3, 4});
  auto c3 = mgr().tensor({0, 0, 0});
  auto u = mgr().tensorT<uint32_t>({0, 0});
  auto seq = mgr().sequence();
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpMult>(TensorList{a, b}, mgr().algorithm()));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMult>(TensorList{a, b, a, b}, mgr().algorithm()));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMult>(TensorList{a, b, c3}, mgr().algorithm()));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMult>(TensorList{a, b, u}, mgr().algorithm()));
}

TEST_P(KpTest, AlgorithmArgumentErrors) {
  auto t = mgr().tensor({1, 2, 3});
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { float out_v[]; };
    void main() { out_v[gl_GlobalInvocationID.x] = 1.0; }
  )";
  // Not SPIR-V, and SPIR-V's magic followed by garbage.
  EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({t}, std::vector<uint32_t>{1, 2, 3}));
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().algorithm({t}, std::vector<uint32_t>{0x07230203u, 0, 0, 0, 0, 7}));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({t}, std::vector<uint32_t>{}));

  // More workgroups than the device allows.
  const auto limits = mgr().getDeviceProperties().limits;
  for (int d = 0; d < 3; ++d) {
    if (limits.maxComputeWorkGroupCount[d] == UINT32_MAX) continue;
    kp::Workgroup wg = {1, 1, 1};
    wg[d] = limits.maxComputeWorkGroupCount[d] + 1;
    EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({t}, kp::compileSource(kShader), wg))
        << "dimension " << d;
  }
  // Push constants must be whole 4-byte words (Vulkan's rule).
  EXPECT_KP_ERROR(
      kInvalidArgument,
      (mgr().algorithm<float, uint8_t>({t}, kp::compileSource(kShader), {1, 1, 1}, {}, {1, 2, 3})));
  // Workgroup x = 0 needs a tensor to take the size from.
  EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({}, kp::compileSource(kShader)));
}

// Shaders that do not fit their algorithm or the device are refused by either backend.
TEST_P(KpTest, ShadersThatDoNotFitAreRefused) {
  auto t = mgr().tensor({1, 2, 3});
  constexpr char kBufferReference[] = R"(
    #version 450
    #extension GL_EXT_buffer_reference : require
    layout(local_size_x = 1) in;
    layout(buffer_reference, std430) buffer Floats { float v[]; };
    layout(set = 0, binding = 0) buffer Pointers { Floats target; };
    void main() { target.v[0] = 1.0; }
  )";
  EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({t}, kp::compileSource(kBufferReference)));
  constexpr char kSecondBinding[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    void main() { out_v[0] = 1.0; }
  )";
  EXPECT_KP_ERROR(kInvalidArgument, mgr().algorithm({t}, kp::compileSource(kSecondBinding)));
}

// A push-constant block larger than the values given reads zeros past them.
TEST_P(KpTest, PushConstantBlockLargerThanTheValuesReadsZeros) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Out { float out_v[]; };
    layout(push_constant) uniform Push { float a; float b; float c; } push;
    void main() { out_v[0] = push.a; out_v[1] = push.b; out_v[2] = push.c; }
  )";
  auto out = mgr().tensor({-1, -1, -1});
  auto algo = mgr().algorithm<float, float>({out}, kp::compileSource(kShader), {1, 1, 1}, {}, {5});
  RunOnce(mgr(), algo, {out});
  EXPECT_EQ(out->vector(), (std::vector<float>{5, 0, 0}));
}

// A shader that reads and writes millions of elements past its small tensor, in another
// Manager (another session of the daemon), neither changes nor sees a large tensor's secret.
TEST_P(KpTest, OutOfBoundsAccessesStayInTheirTensors) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 64) in;
    layout(set = 0, binding = 0) buffer Small { uint small[]; };
    layout(set = 0, binding = 1) buffer Seen { uint seen[]; };
    layout(push_constant) uniform Push { uint stride; } push;
    void main() {
      uint i = gl_GlobalInvocationID.x;
      uint far = uint(small.length()) + i * push.stride;
      seen[i] = small[far];
      small[far] = 0xdeadbeefu;
    }
  )";
  constexpr uint32_t kSecret = 0x5ec12e75u;
  constexpr uint32_t kInvocations = 64 * 64;
  auto secret = mgr().tensorT<uint32_t>(std::vector<uint32_t>(uint32_t{4} << 20, kSecret));
  mgr().sequence()->eval<kp::OpTensorSyncDevice>(TensorList{secret});

  std::unique_ptr<kp::Manager> other = MakeManager(GetParam());
  auto small = other->tensorT<uint32_t>(std::vector<uint32_t>(64, 7));
  auto seen = other->tensorT<uint32_t>(std::vector<uint32_t>(kInvocations, 0));
  auto algo = other->algorithm<uint32_t, uint32_t>({small, seen}, kp::compileSource(kShader),
                                                   {kInvocations / 64, 1, 1}, {}, {1024});
  other->sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{small, seen})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{small, seen})
      ->eval();
  for (const auto& t : {small, seen}) {
    const std::vector<uint32_t> values = t->vector();
    EXPECT_EQ(std::count(values.begin(), values.end(), kSecret), 0);
  }
  // The secret tensor, brought back from the device, is whole.
  std::fill_n(secret->data(), secret->size(), 0u);
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{secret});
  const std::vector<uint32_t> values = secret->vector();
  EXPECT_EQ(std::count(values.begin(), values.end(), kSecret),
            static_cast<ptrdiff_t>(values.size()));
}

}  // namespace
}  // namespace kptest
