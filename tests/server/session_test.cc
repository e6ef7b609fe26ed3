// Session on its own, without gRPC: a DevicePool on the first Vulkan device (lavapipe without a
// GPU), Metrics, and requests in the session's own terms.
#include "session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "device_pool.h"
#include "metrics.h"
#include "quota.h"
#include "server_options.h"

namespace komputed::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// y[i] = a * x[i] + y[i], a in a push constant; one invocation per element.
constexpr char kSaxpyShader[] = R"(
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push { float a; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  y[i] = a * x[i] + y[i];
}
)";

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

std::vector<uint8_t> PushFloat(float value) {
  std::vector<uint8_t> bytes(sizeof(value));
  std::memcpy(bytes.data(), &value, sizeof(value));
  return bytes;
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = DevicePool::Create(options_, &metrics_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    PooledDevice& device = pool_->at(0);
    auto queues = device.AcquireQueues({});
    ASSERT_TRUE(queues.ok()) << queues.status();
    SessionFacts facts;
    facts.id = "session-test";
    facts.device = &device;
    facts.instance = device.instance();
    facts.queues = *std::move(queues);
    facts.client_name = "session_test";
    session_ = std::make_unique<Session>(std::move(facts), options_, &metrics_, nullptr);
  }

  void TearDown() override {
    session_.reset();
    pool_.reset();
  }

  // Runs an eval and waits for its result.
  absl::StatusOr<EvalResult> Eval(const EvalPlan& plan) {
    std::optional<absl::StatusOr<EvalResult>> result;
    absl::Notification done;
    session_->Eval(plan, absl::InfiniteFuture(), /*may_wait_inline=*/false,
                   [&](absl::StatusOr<EvalResult> r) {
                     result = std::move(r);
                     done.Notify();
                   });
    done.WaitForNotification();
    return *std::move(result);
  }

  static TensorRequest Floats32(uint64_t handle, const std::string& data,
                                core::MemoryType memory = core::MemoryType::kDevice) {
    TensorRequest t;
    t.handle = handle;
    t.type = core::ElementType::kFloat32;
    t.memory = memory;
    t.count = data.size() / sizeof(float);
    t.data = data;
    return t;
  }

  static AlgorithmRequest Saxpy(uint64_t handle, uint64_t x, uint64_t y, uint32_t count, float a) {
    AlgorithmRequest r;
    r.handle = handle;
    r.tensors = {x, y};
    r.shader_kind = AlgorithmRequest::Shader::kGlsl;
    r.shader = kSaxpyShader;
    r.workgroup = {count, 1, 1};
    r.push_constants = PushFloat(a);
    return r;
  }

  static HandleOp Op(core::OpKind kind, std::vector<uint64_t> tensors) {
    HandleOp op;
    op.kind = kind;
    op.tensors = std::move(tensors);
    return op;
  }

  static HandleOp DispatchOf(uint64_t algorithm) {
    HandleOp op;
    op.kind = core::OpKind::kDispatch;
    op.algorithm = algorithm;
    return op;
  }

  static RecordRequest RecordOps(uint64_t sequence, std::vector<HandleOp> ops) {
    RecordRequest r;
    r.sequence = sequence;
    for (HandleOp& op : ops) r.actions.push_back({SequenceAction::Kind::kRecord, std::move(op)});
    return r;
  }

  // x = {1, 2, 3, 4} (1), y = {10, 20, 30, 40} (2), saxpy with a = 2 (3), and sequence 4 that
  // syncs both up, dispatches and syncs y back.
  void MakeSaxpy() {
    ASSERT_TRUE(session_->CreateTensor(Floats32(1, x_)).ok());
    ASSERT_TRUE(session_->CreateTensor(Floats32(2, y_)).ok());
    absl::Status s = session_->CreateAlgorithm(Saxpy(3, 1, 2, 4, 2.0f));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(session_->CreateSequence({4, 0, 0}).ok());
    s = session_->Record(RecordOps(4, {Op(core::OpKind::kSyncDevice, {1, 2}), DispatchOf(3),
                                       Op(core::OpKind::kSyncLocal, {2})}));
    ASSERT_TRUE(s.ok()) << s;
  }

  ServerOptions options_;
  Metrics metrics_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<Session> session_;
  const std::string x_ = FloatBytes({1, 2, 3, 4});
  const std::string y_ = FloatBytes({10, 20, 30, 40});
};

core::PhysicalDeviceInfo WithFamilies(std::vector<VkQueueFlags> flags) {
  core::PhysicalDeviceInfo info;
  for (VkQueueFlags f : flags) {
    VkQueueFamilyProperties p{};
    p.queueFlags = f;
    p.queueCount = 4;
    info.queue_families.push_back(p);
  }
  return info;
}

TEST(DefaultSessionFamilies, ComputeOnlyFamiliesServeSessionsWhereThereAreAny) {
  constexpr VkQueueFlags kG = VK_QUEUE_GRAPHICS_BIT, kC = VK_QUEUE_COMPUTE_BIT,
                         kT = VK_QUEUE_TRANSFER_BIT;
  // The H200's: graphics+compute, transfer, compute, video.
  EXPECT_THAT(DefaultSessionFamilies(WithFamilies({kG | kC | kT, kT, kC | kT, 0})),
              ::testing::ElementsAre(2u));
  EXPECT_THAT(DefaultSessionFamilies(WithFamilies({kG | kC | kT, kC, kC | kT})),
              ::testing::ElementsAre(1u, 2u));
  // lavapipe's one family, and a device without compute.
  EXPECT_THAT(DefaultSessionFamilies(WithFamilies({kG | kC | kT})), ::testing::ElementsAre(0u));
  EXPECT_THAT(DefaultSessionFamilies(WithFamilies({kG | kT, kT})), ::testing::IsEmpty());
}

TEST(DevicePoolOptions, DevicesTakeTheDispatchShareAndTheGivenInvocationSlots) {
  ServerOptions options;
  options.dispatch_share = 0.25;
  options.invocation_slots = 8192;
  Metrics metrics;
  auto pool = DevicePool::Create(options, &metrics);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const core::Device& device = *(*pool)->at(0).instance()->device;
  EXPECT_EQ(device.resident_invocations(), 8192u);
  EXPECT_DOUBLE_EQ(device.dispatch_share(), 0.25);
  EXPECT_EQ(device.ResidentWorkgroupLimit(1024), 2u);  // 2048 slots
}

TEST_F(SessionTest, SaxpyEvalReturnsTheResult) {
  MakeSaxpy();
  EvalPlan plan;
  plan.sequence = 4;
  plan.downloads = {2};
  absl::StatusOr<EvalResult> result = Eval(plan);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->downloads.size(), 1u);
  EXPECT_EQ(result->downloads[0].tensor, 2u);
  EXPECT_THAT(Floats(result->downloads[0].data), ElementsAre(12, 24, 36, 48));

  // Again, with x uploaded first (y holds the first result).
  const std::string ones = FloatBytes({1, 1, 1, 1});
  plan.uploads = {{1, 0, ones}};
  result = Eval(plan);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(Floats(result->downloads[0].data), ElementsAre(14, 26, 38, 50));
}

TEST_F(SessionTest, EvalManyRunsNoFurtherRunOnceCancelled) {
  MakeSaxpy();
  // The second uploads into x, which the first submits: it goes in a run of its own.
  const std::string ones = FloatBytes({1, 1, 1, 1});
  const std::string fives = FloatBytes({5, 5, 5, 5});
  EvalPlan first;
  first.sequence = 4;
  first.uploads = {{1, 0, ones}};
  first.downloads = {2};
  EvalPlan second = first;
  second.uploads = {{1, 0, fives}};
  std::vector<EvalPlan> plans = {first, second};
  std::vector<std::optional<absl::StatusOr<EvalResult>>> results(2);
  std::vector<absl::Notification> done(2);
  std::vector<Session::EvalDone> dones;
  for (size_t i = 0; i < 2; ++i) {
    dones.push_back([&, i](absl::StatusOr<EvalResult> r) {
      results[i] = std::move(r);
      done[i].Notify();
    });
  }
  int asked = 0;
  session_->EvalMany(plans, std::move(dones), [&] { return ++asked > 1; });  // after the first
  for (auto& d : done) ASSERT_TRUE(d.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(asked, 2);
  ASSERT_TRUE(results[0]->ok()) << results[0]->status();
  EXPECT_THAT(Floats((*results[0])->downloads[0].data), ElementsAre(12, 22, 32, 42));
  EXPECT_EQ(results[1]->status().code(), absl::StatusCode::kCancelled);
  // The cancelled one changed nothing: x is still the first one's.
  EvalPlan again;
  again.sequence = 4;
  again.downloads = {2};
  absl::StatusOr<EvalResult> result = Eval(again);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(Floats(result->downloads[0].data), ElementsAre(14, 24, 34, 44));
}

// As on a GPU whose device memory the host cannot map: new tensors' first contents travel with
// the session's next submission, so creating one waits for nothing on the device.
class UnmappedSessionTest : public SessionTest {
 protected:
  void SetUp() override {
    options_.map_device_memory = false;
    SessionTest::SetUp();
  }
};

TEST_F(UnmappedSessionTest, NewTensorsHaveTheirContentsOnTheDevice) {
  // No sync to the device first: the dispatch reads what the tensors were created with.
  ASSERT_TRUE(session_->CreateTensor(Floats32(1, x_)).ok());
  ASSERT_TRUE(session_->CreateTensor(Floats32(2, y_, core::MemoryType::kStorage)).ok());
  ASSERT_TRUE(session_->CreateTensor(Floats32(5, FloatBytes({9, 9, 9, 9}))).ok());
  TensorRequest zeros = Floats32(6, "");
  zeros.count = 4;
  ASSERT_TRUE(session_->CreateTensor(zeros).ok());
  absl::Status s = session_->CreateAlgorithm(Saxpy(3, 1, 2, 4, 2.0f));
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(session_->CreateSequence({4, 0, 0}).ok());
  s = session_->Record(RecordOps(
      4, {DispatchOf(3), Op(core::OpKind::kCopy, {2, 5}), Op(core::OpKind::kSyncLocal, {5, 6})}));
  ASSERT_TRUE(s.ok()) << s;
  EvalPlan plan;
  plan.sequence = 4;
  plan.downloads = {5, 6};
  absl::StatusOr<EvalResult> result = Eval(plan);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->downloads.size(), 2u);
  EXPECT_THAT(Floats(result->downloads[0].data), ElementsAre(12, 24, 36, 48));
  EXPECT_THAT(Floats(result->downloads[1].data), ElementsAre(0, 0, 0, 0));
}

TEST_F(SessionTest, CommandsOfAnEvalRunBeforeTheSubmission) {
  EvalPlan plan;
  plan.commands.push_back({"create_tensor 1", SessionCommand(Floats32(1, x_))});
  plan.commands.push_back({"create_tensor 2", SessionCommand(Floats32(2, y_))});
  plan.commands.push_back({"create_algorithm 3", SessionCommand(Saxpy(3, 1, 2, 4, 3.0f))});
  plan.commands.push_back({"create_sequence 4", SessionCommand(SequenceRequest{4, 0, 0})});
  plan.commands.push_back({"record 4", SessionCommand(RecordOps(
                                           4, {Op(core::OpKind::kSyncDevice, {1, 2}), DispatchOf(3),
                                               Op(core::OpKind::kSyncLocal, {2})}))});
  plan.sequence = 4;
  plan.downloads = {2};
  absl::StatusOr<EvalResult> result = Eval(plan);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(Floats(result->downloads[0].data), ElementsAre(13, 26, 39, 52));

  // A failing command is named; the ones before it stay applied.
  EvalPlan failing;
  failing.commands.push_back({"create_tensor 5", SessionCommand(Floats32(5, x_))});
  failing.commands.push_back({"create_tensor 1", SessionCommand(Floats32(1, x_))});
  result = Eval(failing);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(result.status().message(), HasSubstr("command 1 (create_tensor 1): "));
  EXPECT_TRUE(session_->DestroyTensor(5).ok());
}

TEST_F(SessionTest, CopyOntoItsOwnSourceIsInvalidAndRecordsNothing) {
  MakeSaxpy();
  ASSERT_TRUE(session_->CreateSequence({5, 0, 0}).ok());
  // A good action before the bad one: neither is recorded.
  absl::Status s = session_->Record(
      RecordOps(5, {Op(core::OpKind::kSyncDevice, {1}), Op(core::OpKind::kCopy, {1, 1})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("record into sequence 5: action 1: OpTensorCopy"));
  EXPECT_THAT(s.message(), HasSubstr("tensors 1, 1 of this session"));

  // Nothing was recorded: the eval submits nothing and has no timestamps to wait for.
  EvalPlan plan;
  plan.sequence = 5;
  absl::StatusOr<EvalResult> result = Eval(plan);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->timestamps_ns.empty());

  // A copy of another shape is rejected by core's rule too, naming the handles.
  ASSERT_TRUE(session_->CreateTensor(Floats32(6, FloatBytes({1, 2, 3}))).ok());
  s = session_->Record(RecordOps(5, {Op(core::OpKind::kCopy, {1, 6})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensors 1, 6 of this session"));

  // A dispatch override of the wrong size.
  HandleOp dispatch = DispatchOf(3);
  dispatch.push_constants = std::vector<uint8_t>(12, 0);
  s = session_->Record(RecordOps(5, {dispatch}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("12 bytes given"));
  EXPECT_THAT(s.message(), HasSubstr("(algorithm 3)"));
}

TEST_F(SessionTest, UnknownHandlesAreNotFound) {
  MakeSaxpy();
  absl::Status s = session_->DestroyTensor(99);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "tensor 99 not found in this session");
  EXPECT_EQ(session_->DestroyAlgorithm(98).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DestroySequence(97).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->CreateAlgorithm(Saxpy(7, 1, 96, 4, 1.0f)).code(),
            absl::StatusCode::kNotFound);
  s = session_->Record(RecordOps(4, {DispatchOf(95)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("algorithm 95"));
  EXPECT_EQ(session_->Record(RecordOps(94, {})).code(), absl::StatusCode::kNotFound);
  EvalPlan plan;
  plan.downloads = {93};
  EXPECT_EQ(Eval(plan).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->GetTimestamps(92).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionTest, DuplicateHandlesAlreadyExist) {
  MakeSaxpy();
  absl::Status s = session_->CreateTensor(Floats32(1, x_));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), "tensor 1 already exists in this session");
  EXPECT_EQ(session_->CreateAlgorithm(Saxpy(3, 1, 2, 4, 1.0f)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(session_->CreateSequence({4, 0, 0}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(session_->CreateTensor(Floats32(0, x_)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionTest, BadShapesAreInvalidAndCreateNothing) {
  TensorRequest empty = Floats32(10, "");
  absl::Status s = session_->CreateTensor(empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor 10: "));
  TensorRequest short_data = Floats32(11, x_);
  short_data.count = 5;
  s = session_->CreateTensor(short_data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data of 16 bytes given"));
  EXPECT_EQ(session_->DestroyTensor(10).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DestroyTensor(11).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->memory_bytes(), 0u);
}

TEST_F(SessionTest, CloseFreesMemoryAndLaterCallsAreNotFound) {
  MakeSaxpy();
  ASSERT_TRUE(session_->CreateTensor(Floats32(8, x_, core::MemoryType::kHost)).ok());
  // Two kDevice tensors of 16 bytes count twice (buffer and staging); the host one once.
  EXPECT_EQ(session_->memory_bytes(), 2 * 2 * 16u + 16u);
  EXPECT_EQ(pool_->at(0).memory_in_use(), session_->memory_bytes());
  SessionSummary summary = session_->Describe();
  EXPECT_EQ(summary.tensors, 3u);
  EXPECT_EQ(summary.algorithms, 1u);
  EXPECT_EQ(summary.sequences, 1u);

  session_->Close();
  EXPECT_EQ(session_->memory_bytes(), 0u);
  EXPECT_EQ(pool_->at(0).memory_in_use(), 0u);
  EXPECT_EQ(session_->CreateTensor(Floats32(9, x_)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DestroyTensor(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->HostTensor(8).status().code(), absl::StatusCode::kNotFound);
  EvalPlan plan;
  plan.sequence = 4;
  EXPECT_EQ(Eval(plan).status().code(), absl::StatusCode::kNotFound);
  session_->Close();  // idempotent
  EXPECT_EQ(session_->Describe().tensors, 0u);
}

TEST_F(SessionTest, SessionsOfATenantShareTheirSmallTensorsBlocksAndTenantsDoNot) {
  PooledDevice& device = pool_->at(0);
  std::vector<std::unique_ptr<Session>> sessions;
  auto open = [&](const std::string& id, std::shared_ptr<TenantAccount> account) -> Session& {
    auto queues = device.AcquireQueues({});
    EXPECT_TRUE(queues.ok()) << queues.status();
    SessionFacts facts;
    facts.id = id;
    facts.device = &device;
    facts.instance = device.instance();
    facts.queues = queues.ok() ? *std::move(queues) : std::vector<uint32_t>{};
    facts.client_name = id;
    facts.account = std::move(account);
    sessions.push_back(std::make_unique<Session>(std::move(facts), options_, &metrics_, nullptr));
    return *sessions.back();
  };
  auto a = std::make_shared<TenantAccount>("a", Quota{}, &metrics_);
  auto b = std::make_shared<TenantAccount>("b", Quota{}, &metrics_);
  const std::string data = FloatBytes({1, 2, 3, 4});
  for (Session* s : {&open("a1", a), &open("a2", a), &open("b1", b)}) {
    ASSERT_TRUE(s->CreateTensor(Floats32(1, data)).ok());
  }
  std::shared_ptr<core::MemoryPool> pool_a = device.instance()->MemoryPoolFor("a");
  std::shared_ptr<core::MemoryPool> pool_b = device.instance()->MemoryPoolFor("b");
  ASSERT_NE(pool_a, nullptr);
  EXPECT_NE(pool_a, pool_b);
  EXPECT_EQ(pool_a, device.instance()->MemoryPoolFor("a"));
  // A device tensor: its device buffer and its staging buffer.
  EXPECT_EQ(pool_a->pieces(), 4u);
  EXPECT_EQ(pool_b->pieces(), 2u);
  for (auto& s : sessions) s->Close();
  EXPECT_EQ(pool_a->pieces(), 0u);
  EXPECT_EQ(pool_a->blocks(), 0u);
  EXPECT_EQ(pool_b->blocks(), 0u);
}

TEST_F(SessionTest, TensorMemoryIsNotPooledWhenTurnedOff) {
  ServerOptions options = options_;
  options.pool_tensor_memory = false;
  auto pool = DevicePool::Create(options, &metrics_);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->at(0).instance()->MemoryPoolFor(""), nullptr);
}

}  // namespace
}  // namespace komputed::server
