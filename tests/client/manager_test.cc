// The Manager: devices and queues, object lifetimes and destroy(), errors, threads.
#include <atomic>
#include <string>
#include <thread>

#include "kp_test.h"
#include "support/scoped_env.h"

namespace kptest {
namespace {

using komputed::test_support::ScopedEnv;
using ::testing::HasSubstr;

constexpr char kTimesTwo[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer In { float in_v[]; };
  layout(set = 0, binding = 1) buffer Out { float out_v[]; };
  void main() { uint i = gl_GlobalInvocationID.x; out_v[i] += in_v[i] * 2.0; }
)";

TEST_P(KpTest, DescribesTheDevice) {
  vk::PhysicalDeviceProperties props = mgr().getDeviceProperties();
  std::string name = props.deviceName.data();
  EXPECT_FALSE(name.empty());
  std::vector<kp::PhysicalDevice> devices = mgr().listDevices();
  ASSERT_FALSE(devices.empty());
  bool listed = false;
  for (const auto& d : devices) {
    listed |= name == std::string(d.getProperties().deviceName.data());
  }
  EXPECT_TRUE(listed) << name << " is not among listDevices()";
}

// Kompute's listDevices() returns Vulkan handles, and programs write
// `const std::vector<vk::PhysicalDevice> devices = mgr.listDevices();`. In-process those are real
// handles; a remote Manager has none of the daemon's devices and says what to use instead.
TEST_P(KpTest, ListDevicesAsVulkanHandles) {
  const std::string name = mgr().getDeviceProperties().deviceName.data();
  if (GetParam() == BackendKind::kInProcess) {
    const std::vector<vk::PhysicalDevice> devices = mgr().listDevices();
    ASSERT_FALSE(devices.empty());
    bool listed = false;
    for (const vk::PhysicalDevice& d : devices) {
      ASSERT_TRUE(d);
      listed |= name == std::string(d.getProperties().deviceName.data());
    }
    EXPECT_TRUE(listed) << name << " is not among listDevices()";
  } else {
    EXPECT_KP_ERROR(kUnimplemented,
                    const std::vector<vk::PhysicalDevice> devices = mgr().listDevices());
    // The list itself is there, as kp::PhysicalDevice.
    const kp::DeviceList devices = mgr().listDevices();
    ASSERT_FALSE(devices.empty());
    EXPECT_FALSE(devices[0].handle());
  }
}

TEST_P(KpTest, UnsupportedExtensionsAreSkipped) {
  auto m = MakeManager(GetParam(), 0, {}, {"VK_KOMPUTED_no_such_extension"});
  auto t = m->tensor({1, 2});
  m->sequence()->eval<kp::OpTensorSyncDevice>(TensorList{t});
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 2}));
}

TEST_P(KpTest, ManagerRejectsMissingDevicesAndQueues) {
  EXPECT_KP_ERROR(kInvalidArgument, MakeManager(GetParam(), 99, {}));
  // No family has 1024 queues.
  EXPECT_KP_ERROR(kInvalidArgument, MakeManager(GetParam(), 0, std::vector<uint32_t>(1024, 0)));
  EXPECT_KP_ERROR(kInvalidArgument, MakeManager(GetParam(), 0, {999}));
  // The default Manager has one queue.
  EXPECT_KP_ERROR(kInvalidArgument, mgr().sequence(1));
}

TEST_P(KpTest, DefaultManagerTakesItsDeviceFromKomputedDevice) {
  {
    ScopedEnv device("KOMPUTED_DEVICE", "0");
    auto m = MakeDefaultManager(GetParam());
    EXPECT_EQ(std::string(m->getDeviceProperties().deviceName.data()),
              std::string(mgr().getDeviceProperties().deviceName.data()));
    auto t = m->tensor({1, 2, 3});
    m->sequence()->eval<kp::OpTensorSyncDevice>(TensorList{t});
  }
  {
    ScopedEnv device("KOMPUTED_DEVICE", "57");
    try {
      MakeDefaultManager(GetParam());
      ADD_FAILURE() << "KOMPUTED_DEVICE=57 was accepted";
    } catch (const kp::Error& e) {
      EXPECT_EQ(e.code(), kp::ErrorCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("57"));
    }
  }
  for (const char* bad : {"gpu1", "-1", "1.5"}) {
    ScopedEnv device("KOMPUTED_DEVICE", bad);
    try {
      MakeDefaultManager(GetParam());
      ADD_FAILURE() << "KOMPUTED_DEVICE=" << bad << " was accepted";
    } catch (const kp::Error& e) {
      EXPECT_EQ(e.code(), kp::ErrorCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("KOMPUTED_DEVICE"));
      EXPECT_THAT(e.what(), HasSubstr(bad));
    }
  }
}

TEST_P(KpTest, TensorArgumentErrors) {
  EXPECT_KP_ERROR(kInvalidArgument, mgr().tensor(std::vector<float>{}));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().tensorT<uint32_t>(size_t{0}));
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().tensor(nullptr, 0, 4, kp::Tensor::TensorDataTypes::eFloat));
  // An element size that contradicts the element type.
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().tensor(nullptr, 3, 4, kp::Tensor::TensorDataTypes::eBool));
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().tensor(nullptr, 3, 2, kp::Tensor::TensorDataTypes::eFloat));
  EXPECT_KP_ERROR(kInvalidArgument,
                  mgr().tensor(nullptr, 3, 0, kp::Tensor::TensorDataTypes::eCustom));
}

TEST_P(KpTest, CompileSourceReportsGlslErrors) {
  try {
    kp::compileSource(R"(
      #version 450
      layout(local_size_x = 1) in;
      void main() { undefined_thing = 1; }
    )");
    FAIL() << "compileSource accepted bad GLSL";
  } catch (const kp::Error& e) {
    EXPECT_EQ(e.code(), kp::ErrorCode::kInvalidArgument) << CodeName(e.code());
    EXPECT_THAT(e.what(), HasSubstr("undefined_thing"));
  }
  std::vector<uint32_t> spirv = kp::compileSource(kTimesTwo);
  ASSERT_FALSE(spirv.empty());
  EXPECT_EQ(spirv[0], 0x07230203u);
}

TEST_P(KpTest, ObjectsOfAnotherManagerAreRefused) {
  auto other = MakeManager(GetParam());
  auto mine = mgr().tensor({1, 2});
  auto theirs = other->tensor({3, 4});
  EXPECT_KP_ERROR(kFailedPrecondition,
                  mgr().algorithm({mine, theirs}, kp::compileSource(kTimesTwo)));
  EXPECT_KP_ERROR(kFailedPrecondition,
                  mgr().sequence()->record<kp::OpTensorSyncDevice>(TensorList{theirs}));
  auto their_algo = other->algorithm({theirs, theirs}, kp::compileSource(kTimesTwo));
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().sequence()->record<kp::OpAlgoDispatch>(their_algo));
}

TEST_P(KpTest, DestroyedTensorCannotBeUsed) {
  auto t = mgr().tensor({1, 2, 3});
  EXPECT_TRUE(t->isInit());
  t->destroy();
  EXPECT_FALSE(t->isInit());
  EXPECT_EQ(t->data(), nullptr);
  EXPECT_EQ(t->size(), 3u);  // the description stays
  EXPECT_KP_ERROR(kFailedPrecondition, t->vector());
  EXPECT_KP_ERROR(kFailedPrecondition, t->setData({4, 5, 6}));
  auto seq = mgr().sequence();
  EXPECT_KP_ERROR(kFailedPrecondition, seq->record<kp::OpTensorSyncDevice>(TensorList{t}));
  EXPECT_KP_ERROR(kFailedPrecondition, seq->record<kp::OpTensorSyncLocal>(TensorList{t}));
  EXPECT_KP_ERROR(kFailedPrecondition,
                  seq->record<kp::OpTensorCopy>(TensorList{mgr().tensor({0, 0, 0}), t}));
  EXPECT_KP_ERROR(kFailedPrecondition,
                  mgr().algorithm({t, mgr().tensor({0, 0, 0})}, kp::compileSource(kTimesTwo)));
  t->destroy();  // again: harmless
  EXPECT_FALSE(t->isInit());
}

// A recorded sequence keeps what it uses: destroying a tensor it recorded does not break it.
TEST_P(KpTest, DestroyingARecordedTensorKeepsTheSequenceValid) {
  auto in = mgr().tensor({1, 2, 3});
  auto out = mgr().tensor({0, 0, 0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTimesTwo));
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorSyncDevice>(TensorList{in})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 4, 6}));
  in->destroy();
  seq->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{4, 8, 12}));
}

TEST_P(KpTest, DestroyedAlgorithmCannotBeDispatched) {
  auto in = mgr().tensor({1});
  auto out = mgr().tensor({0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTimesTwo));
  EXPECT_TRUE(algo->isInit());
  algo->destroy();
  EXPECT_FALSE(algo->isInit());
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().sequence()->record<kp::OpAlgoDispatch>(algo));
  EXPECT_KP_ERROR(kFailedPrecondition, algo->rebuild({in, out}, kp::compileSource(kTimesTwo)));
  algo->destroy();
}

TEST_P(KpTest, DestroyedSequenceCannotBeUsed) {
  auto t = mgr().tensor({1});
  auto seq = mgr().sequence();
  seq->eval<kp::OpTensorSyncDevice>(TensorList{t});
  EXPECT_TRUE(seq->isInit());
  seq->destroy();
  EXPECT_FALSE(seq->isInit());
  EXPECT_FALSE(seq->isRunning());
  EXPECT_FALSE(seq->isRecording());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->record<kp::OpTensorSyncDevice>(TensorList{t}));
  EXPECT_KP_ERROR(kFailedPrecondition, seq->evalAsync());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->evalAwait());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->rerecord());
  seq->destroy();
}

// Destroying a sequence that is running waits for it.
TEST_P(KpTest, DestroyingARunningSequenceWaitsForIt) {
  constexpr char kFill[] = R"(
    #version 450
    layout(local_size_x = 64) in;
    layout(set = 0, binding = 0) buffer Out { uint v[]; };
    void main() { uint i = gl_GlobalInvocationID.x; v[i] = i * 3u + 1u; }
  )";
  constexpr uint32_t kSize = 1u << 16;
  auto out = mgr().tensorT<uint32_t>(size_t{kSize}, kp::Tensor::TensorTypes::eHost);
  auto algo = mgr().algorithm({out}, kp::compileSource(kFill), kp::Workgroup({kSize / 64, 1, 1}));
  auto seq = mgr().sequence();
  seq->evalAsync<kp::OpAlgoDispatch>(algo);
  seq->destroy();
  EXPECT_FALSE(seq->isInit());
  std::vector<uint32_t> got = out->vector();
  EXPECT_EQ(got[0], 1u);
  EXPECT_EQ(got[kSize - 1], (kSize - 1) * 3u + 1u);
}

// Dropping the last reference to a running sequence neither waits nor breaks anything: the
// Manager's other objects keep working (remotely, the daemon finishes and frees the sequence).
TEST_P(KpTest, DroppingARunningSequenceReleasesIt) {
  auto in = mgr().tensor({1, 2});
  auto out = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTimesTwo));
  for (int i = 0; i < 3; ++i) {
    auto seq = mgr().sequence();
    seq->record<kp::OpTensorSyncDevice>(TensorList{in})->record<kp::OpAlgoDispatch>(algo);
    seq->evalAsync();
  }
  auto copy = mgr().tensor({0, 0});
  mgr().sequence()->eval<kp::OpTensorCopy>(TensorList{in, copy});
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{copy});
  EXPECT_EQ(copy->vector(), (std::vector<float>{1, 2}));
}

TEST_P(KpTest, ManagerDestroyReleasesEverything) {
  auto in = mgr().tensor({1, 2});
  auto out = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTimesTwo));
  auto seq = mgr().sequence();
  seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{out})->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 4}));

  mgr().destroy();
  EXPECT_FALSE(in->isInit());
  EXPECT_FALSE(out->isInit());
  EXPECT_FALSE(algo->isInit());
  EXPECT_FALSE(seq->isInit());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_KP_ERROR(kFailedPrecondition, out->vector());
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().tensor({1}));
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().sequence());
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().algorithm());
  EXPECT_KP_ERROR(kFailedPrecondition, mgr().getDeviceProperties());
  mgr().destroy();  // again: harmless
}

TEST_P(KpTest, ObjectsMayOutliveTheirManager) {
  std::shared_ptr<kp::TensorT<float>> in, out;
  std::shared_ptr<kp::Algorithm> algo;
  std::shared_ptr<kp::Sequence> seq;
  {
    std::unique_ptr<kp::Manager> m = MakeManager(GetParam());
    in = m->tensor({1, 2});
    out = m->tensor({0, 0});
    algo = m->algorithm({in, out}, kp::compileSource(kTimesTwo));
    seq = m->sequence();
    seq->record<kp::OpAlgoDispatch>(algo)->record<kp::OpTensorSyncLocal>(TensorList{out})->eval();
    EXPECT_EQ(out->vector(), (std::vector<float>{2, 4}));
    // A sequence still in flight when the Manager goes.
    seq->evalAsync();
  }
  EXPECT_FALSE(in->isInit());
  EXPECT_FALSE(out->isInit());
  EXPECT_FALSE(algo->isInit());
  EXPECT_FALSE(seq->isInit());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->eval());
  EXPECT_KP_ERROR(kFailedPrecondition, seq->evalAwait());
  EXPECT_KP_ERROR(kFailedPrecondition, out->vector());
  EXPECT_KP_ERROR(kFailedPrecondition, algo->setPushConstants(std::vector<float>{}));
  // Dropping them now is fine.
  seq.reset();
  algo.reset();
  in.reset();
  out.reset();
}

// Manager::clear() forgets objects that are gone; those alive are unaffected.
TEST_P(KpTest, ClearForgetsReleasedObjects) {
  auto kept = mgr().tensor({5});
  for (int i = 0; i < 10; ++i) mgr().tensor({1.0f * i});
  mgr().clear();
  EXPECT_TRUE(kept->isInit());
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{kept});
  EXPECT_EQ(kept->vector(), std::vector<float>{5});
}

// Eight threads share one Manager, each with its own tensors, algorithm and sequence.
TEST_P(KpTest, ThreadsShareOneManager) {
  constexpr char kScale[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer In { float in_v[]; };
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    layout(constant_id = 0) const float k = 0;
    layout(push_constant) uniform Push { float iteration; } push;
    void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = in_v[i] * k + push.iteration; }
  )";
  constexpr int kThreads = 8;
  constexpr int kEvals = 500;
  constexpr uint32_t kSize = 8;
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      try {
        const float k = static_cast<float>(th + 1);
        std::vector<float> in_data(kSize);
        for (uint32_t i = 0; i < kSize; ++i) in_data[i] = static_cast<float>(i + 10 * th);
        auto in = mgr().tensor(in_data);
        auto out = mgr().tensor(std::vector<float>(kSize, -1.0f));
        auto algo = mgr().algorithm({in, out}, kp::compileSource(kScale), {kSize, 1, 1},
                                    std::vector<float>{k}, std::vector<float>{0});
        auto seq = mgr().sequence();
        for (int it = 0; it < kEvals; ++it) {
          seq->record<kp::OpAlgoDispatch>(algo, std::vector<float>{static_cast<float>(it)})
              ->record<kp::OpTensorSyncLocal>(TensorList{out})
              ->eval();
          std::vector<float> got = out->vector();
          for (uint32_t i = 0; i < kSize; ++i) {
            if (got[i] != in_data[i] * k + it) {
              if (wrong++ == 0) {
                errors[th] = "iteration " + std::to_string(it) + " element " + std::to_string(i) +
                             ": " + std::to_string(got[i]) + " instead of " +
                             std::to_string(in_data[i] * k + it);
              }
            }
          }
        }
        ++done;
      } catch (const std::exception& e) {
        errors[th] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(done.load(), kThreads);
  EXPECT_EQ(wrong.load(), 0);
  for (int th = 0; th < kThreads; ++th) EXPECT_EQ(errors[th], "") << "thread " << th;
}

}  // namespace
}  // namespace kptest
