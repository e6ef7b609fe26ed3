// Tests of Sequence: recording, submission, the ops, re-runs, rebuilds, timestamps, waiting,
// and one run under the validation layer.

#include "komputed/core/sequence.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/device.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "support/half_reference.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// b[i] = a[i] * a[i]
constexpr char kSquareShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * a[i];
}
)";

// An instance with the validation layer. The layer (1.3.239, synchronization validation on) keeps
// a few allocations past vkDestroyInstance, and the loader unloads it there, which leaves
// LeakSanitizer a stack of unknown frames that no suppression can name. Held loaded for the
// process's lifetime (RTLD_NODELETE, its symbols private), its allocations are reported under its
// own name, which scripts/lsan.supp suppresses.
absl::StatusOr<std::shared_ptr<Instance>> ValidationInstance() {
  static const bool held =
      dlopen("libVkLayer_khronos_validation.so", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) != nullptr;
  (void)held;  // without the library, Instance::Create says that the layer is missing
  return Instance::Create(true);
}

absl::StatusOr<std::vector<uint32_t>> Compile(const char* source) {
  static auto* cache = new std::map<const char*, std::vector<uint32_t>>();
  if (auto it = cache->find(source); it != cache->end()) return it->second;
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(source);
  if (spirv.ok()) (*cache)[source] = *spirv;
  return spirv;
}

template <typename... T>
std::vector<uint8_t> Bytes(T... values) {
  std::vector<uint8_t> out((sizeof(T) + ... + 0));
  size_t offset = 0;
  ((std::memcpy(out.data() + offset, &values, sizeof(T)), offset += sizeof(T)), ...);
  return out;
}

absl::StatusOr<std::shared_ptr<Tensor>> Floats(const std::vector<float>& values,
                                               MemoryType memory = MemoryType::kDevice,
                                               std::shared_ptr<Device> device = TestDevice()) {
  return Tensor::Create(std::move(device), ElementType::kFloat32, values.size(), 0, memory,
                        values.data());
}

std::vector<float> HostFloats(const Tensor& t) {
  const float* p = static_cast<const float*>(t.host_data());
  if (p == nullptr) return {};
  return std::vector<float>(p, p + t.count());
}

void SetHostFloats(const Tensor& t, const std::vector<float>& values) {
  std::memcpy(t.host_data(), values.data(), values.size() * sizeof(float));
}

// An algorithm of `source` over {a, b}, one invocation per element of a.
absl::StatusOr<std::shared_ptr<Algorithm>> MakeAlgorithm(const char* source,
                                                         std::shared_ptr<Tensor> a,
                                                         std::shared_ptr<Tensor> b,
                                                         std::vector<uint8_t> push = {}) {
  absl::StatusOr<std::vector<uint32_t>> spirv = Compile(source);
  if (!spirv.ok()) return spirv.status();
  AlgorithmSpec spec;
  spec.workgroup = {static_cast<uint32_t>(a->count()), 1, 1};
  spec.tensors = {std::move(a), std::move(b)};
  spec.spirv = *std::move(spirv);
  spec.push_constants = std::move(push);
  std::shared_ptr<Device> device = TestDevice();
  return Algorithm::Create(device, std::move(spec));
}

// The device contents of `t` (any memory type), through a device tensor and a sync to host.
absl::StatusOr<std::vector<float>> DeviceFloats(const std::shared_ptr<Tensor>& t) {
  absl::StatusOr<std::shared_ptr<Tensor>> out = Tensor::Create(
      TestDevice(), ElementType::kFloat32, t->count(), 0, MemoryType::kDevice, nullptr);
  if (!out.ok()) return out.status();
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
  if (!seq.ok()) return seq.status();
  if (absl::Status s = (*seq)->Record(op::Copy{{t, *out}}); !s.ok()) return s;
  if (absl::Status s = (*seq)->Eval(kTimeout); !s.ok()) return s;
  // The copy's host step put t's host data into out's: overwrite it to see the device's data.
  std::memset((*out)->host_data(), 0xff, (*out)->byte_size());
  if (absl::Status s = (*seq)->Clear(); !s.ok()) return s;
  if (absl::Status s = (*seq)->Record(op::SyncToHost{{*out}}); !s.ok()) return s;
  if (absl::Status s = (*seq)->Eval(kTimeout); !s.ok()) return s;
  return HostFloats(**out);
}

TEST(Sequence, SyncDispatchSyncRoundTrip) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3, 4, 5}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  EXPECT_EQ(seq->queue(), 0u);
  EXPECT_FALSE(seq->IsRecording());
  EXPECT_FALSE(seq->IsRunning());

  // New host data, uploaded by the sequence.
  SetHostFloats(*a, {10, 20, 30, 40, 50});
  SetHostFloats(*b, {1, 1, 1, 1, 1});
  ASSERT_OK(seq->Record(op::SyncToDevice{{a, b}}));
  EXPECT_TRUE(seq->IsRecording());
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Submit());
  EXPECT_TRUE(seq->IsRunning());
  EXPECT_FALSE(seq->IsRecording());
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_FALSE(seq->IsRunning());
  EXPECT_THAT(HostFloats(*b), ElementsAre(11, 21, 31, 41, 51));
  EXPECT_THAT(HostFloats(*a), ElementsAre(10, 20, 30, 40, 50));
}

TEST(Sequence, EveryMemoryTypeInAShader) {
  for (MemoryType in :
       {MemoryType::kDevice, MemoryType::kHost, MemoryType::kStorage, MemoryType::kDeviceAndHost}) {
    for (MemoryType out : {MemoryType::kDevice, MemoryType::kHost, MemoryType::kDeviceAndHost}) {
      SCOPED_TRACE(absl::StrCat(MemoryTypeName(in), " -> ", MemoryTypeName(out)));
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}, in));
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({9, 9, 9}, out));
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> square, MakeAlgorithm(kSquareShader, a, b));
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
      ASSERT_OK(seq->Record(op::Dispatch{square}));
      // For host-visible tensors this is only the barrier that makes the writes visible.
      ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
      ASSERT_OK(seq->Eval(kTimeout));
      EXPECT_THAT(HostFloats(*b), ElementsAre(1, 4, 9));
    }
  }
}

TEST(Sequence, EvalTwiceRunsTwice) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2, 3));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4, 6));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(3, 6, 9));
}

TEST(Sequence, RecordingAfterEvalStartsANewCommandBuffer) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(0, 0, 0));  // not synced yet

  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  EXPECT_TRUE(seq->IsRecording());
  ASSERT_OK(seq->Eval(kTimeout));
  // The dispatch ran once, in the first submission.
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2, 3));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2, 3));

  // Rerecord brings back every op since the last Clear: dispatch, then sync.
  ASSERT_OK(seq->Rerecord());
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4, 6));
}

TEST(Sequence, BarrierBetweenDependentDispatches) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3, 4}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  op::MemoryBarrier barrier;
  barrier.tensors = {b};
  barrier.src_access = VK_ACCESS_SHADER_WRITE_BIT;
  barrier.dst_access = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  barrier.src_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  barrier.dst_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(barrier));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(barrier));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(3, 6, 9, 12));
  // A barrier over no tensors is accepted (and records nothing).
  ASSERT_OK(seq->Record(op::MemoryBarrier{}));
}

// A barrier's access masks must suit its stages; a mismatch is refused and records nothing.
TEST(Sequence, BarrierWithMismatchedMasksIsRefused) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  op::MemoryBarrier barrier;
  barrier.tensors = {b};
  barrier.src_access = VK_ACCESS_SHADER_WRITE_BIT;
  barrier.dst_access = VK_ACCESS_SHADER_READ_BIT;
  barrier.src_stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
  barrier.dst_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  EXPECT_THAT(seq->Record(barrier), StatusIs(absl::StatusCode::kInvalidArgument,
                                             AllOf(HasSubstr("srcAccessMask 0x40 (SHADER_WRITE)"),
                                                   HasSubstr("srcStageMask 0x1000 (TRANSFER)"))));
  barrier.src_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
  barrier.dst_stage = VK_PIPELINE_STAGE_VERTEX_SHADER_BIT;
  EXPECT_THAT(seq->Record(barrier),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("VERTEX_SHADER")));
  EXPECT_FALSE(seq->IsRecording());
}

TEST(Sequence, MultiplyShaderForEveryNumericType) {
  struct Case {
    ElementType type;
    std::vector<uint8_t> a, b, want;
  };
  std::vector<Case> cases = {
      {ElementType::kFloat32, Bytes(1.5f, -2.0f), Bytes(2.0f, 3.0f), Bytes(3.0f, -6.0f)},
      {ElementType::kInt32, Bytes(int32_t{-3}, int32_t{7}), Bytes(int32_t{5}, int32_t{-6}),
       Bytes(int32_t{-15}, int32_t{-42})},
      {ElementType::kUInt32, Bytes(uint32_t{3}, uint32_t{1u << 31}),
       Bytes(uint32_t{5}, uint32_t{1}), Bytes(uint32_t{15}, uint32_t{1u << 31})},
  };
  if (TestDevice()->float64_supported()) {
    cases.push_back(
        {ElementType::kFloat64, Bytes(0.1, 3.0), Bytes(10.0, -0.5), Bytes(0.1 * 10.0, -1.5)});
  }
  // The small types: three elements (buffers of a size that is no multiple of 4 bytes), products
  // that wrap as the type's own multiply does.
  cases.push_back({ElementType::kInt16, Bytes(int16_t{-3}, int16_t{300}, int16_t{-32768}),
                   Bytes(int16_t{5}, int16_t{300}, int16_t{-1}),
                   Bytes(int16_t{-15}, int16_t{90000 - 65536}, int16_t{-32768})});
  cases.push_back({ElementType::kUInt16, Bytes(uint16_t{3}, uint16_t{65535}, uint16_t{256}),
                   Bytes(uint16_t{5}, uint16_t{65535}, uint16_t{256}),
                   Bytes(uint16_t{15}, uint16_t{1}, uint16_t{0})});
  cases.push_back({ElementType::kInt8, Bytes(int8_t{-3}, int8_t{100}, int8_t{-128}),
                   Bytes(int8_t{5}, int8_t{3}, int8_t{-1}),
                   Bytes(int8_t{-15}, int8_t{300 - 256}, int8_t{-128})});
  cases.push_back({ElementType::kUInt8, Bytes(uint8_t{3}, uint8_t{255}, uint8_t{16}),
                   Bytes(uint8_t{5}, uint8_t{255}, uint8_t{16}),
                   Bytes(uint8_t{15}, uint8_t{1}, uint8_t{0})});
  // float16 bits: 1.5 × 2 = 3, -2 × 3 = -6, 65504 × 2 overflows to infinity.
  cases.push_back({ElementType::kFloat16,
                   Bytes(uint16_t{0x3E00}, uint16_t{0xC000}, uint16_t{0x7BFF}),
                   Bytes(uint16_t{0x4000}, uint16_t{0x4200}, uint16_t{0x4000}),
                   Bytes(uint16_t{0x4200}, uint16_t{0xC600}, uint16_t{0x7C00})});
  for (const Case& c : cases) {
    SCOPED_TRACE(ElementTypeName(c.type));
    const uint64_t count = c.a.size() / ElementTypeSize(c.type);
    std::vector<std::shared_ptr<Tensor>> t;
    for (const std::vector<uint8_t>* init : {&c.a, &c.b, &c.want}) {
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> tensor,
                           Tensor::Create(TestDevice(), c.type, count, 0, MemoryType::kDevice,
                                          init == &c.want ? nullptr : init->data()));
      t.push_back(tensor);
    }
    ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(c.type));
    AlgorithmSpec spec;
    spec.tensors = t;
    spec.spirv.assign(spirv.begin(), spirv.end());
    ASSERT_OK_AND_ASSIGN(auto workgroup, MultiplyWorkgroup(count));
    spec.workgroup = {workgroup[0], workgroup[1], workgroup[2]};
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> multiply,
                         Algorithm::Create(TestDevice(), spec));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{multiply}));
    ASSERT_OK(seq->Record(op::SyncToHost{{t[2]}}));
    ASSERT_OK(seq->Eval(kTimeout));
    const auto* got = static_cast<const uint8_t*>(t[2]->host_data());
    EXPECT_EQ(std::vector<uint8_t>(got, got + t[2]->byte_size()), c.want);
  }
}

// The float16 multiply over every half: a[i] takes each of the 65536 bit patterns (zeros,
// subnormals, normals, infinities, NaNs) and b[i] a scrambled one, so that products underflow,
// overflow and round; each is checked against the exact product rounded to the nearest half, ties
// to even (test_support::NearestHalf).
TEST(Sequence, MultiplyFloat16RoundsEveryProductToNearestEven) {
  if (!TestDevice()->shader_features().storage_buffer_16bit) {
    GTEST_SKIP() << "the device has no storageBuffer16BitAccess";
  }
  constexpr uint32_t kCount = 65536;
  std::vector<uint16_t> a(kCount), b(kCount);
  for (uint32_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<uint16_t>(i);
    b[i] = static_cast<uint16_t>(i * 40503u + 12345u);  // odd factor: every pattern once
  }
  std::vector<std::shared_ptr<Tensor>> t;
  for (const uint16_t* init : {a.data(), b.data(), static_cast<uint16_t*>(nullptr)}) {
    ASSERT_OK_AND_ASSIGN(
        std::shared_ptr<Tensor> tensor,
        Tensor::Create(TestDevice(), ElementType::kFloat16, kCount, 0, MemoryType::kDevice, init));
    t.push_back(tensor);
  }
  ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(ElementType::kFloat16));
  AlgorithmSpec spec;
  spec.tensors = t;
  spec.spirv.assign(spirv.begin(), spirv.end());
  ASSERT_OK_AND_ASSIGN(auto workgroup, MultiplyWorkgroup(kCount));
  spec.workgroup = {workgroup[0], workgroup[1], workgroup[2]};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> multiply, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::SyncToDevice{{t[0], t[1]}}));
  ASSERT_OK(seq->Record(op::Dispatch{multiply}));
  ASSERT_OK(seq->Record(op::SyncToHost{{t[2]}}));
  ASSERT_OK(seq->Eval(kTimeout));
  std::vector<uint16_t> got(kCount);
  std::memcpy(got.data(), t[2]->host_data(), t[2]->byte_size());
  uint32_t wrong = 0, subnormal = 0, overflow = 0;
  for (uint32_t i = 0; i < kCount; ++i) {
    const double exact = test_support::HalfValue(a[i]) * test_support::HalfValue(b[i]);
    const uint16_t want = test_support::NearestHalf(exact);
    const bool ok =
        test_support::HalfIsNan(want) ? test_support::HalfIsNan(got[i]) : got[i] == want;
    if (!ok && wrong++ < 10) {
      ADD_FAILURE() << "0x" << std::hex << a[i] << " * 0x" << b[i] << " = 0x" << got[i]
                    << ", want 0x" << want << " (" << exact << ")";
    }
    subnormal += (want & 0x7C00) == 0 && (want & 0x3FF) != 0;
    overflow += std::isfinite(exact) && (want & 0x7FFF) == 0x7C00;
  }
  EXPECT_EQ(wrong, 0u);
  // The inputs reach the cases that matter.
  EXPECT_GT(subnormal, 100u);
  EXPECT_GT(overflow, 100u);
}

TEST(Sequence, CopyToEveryMemoryType) {
  const std::vector<float> values = {1.5f, 2.5f, -3.5f, 4.5f};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> src, Floats(values, MemoryType::kDevice));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> device, Floats({0, 0, 0, 0}, MemoryType::kDevice));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> host, Floats({0, 0, 0, 0}, MemoryType::kHost));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> storage, Floats({0, 0, 0, 0}, MemoryType::kStorage));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> both,
                       Floats({0, 0, 0, 0}, MemoryType::kDeviceAndHost));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Copy{{src, device, host, storage, both}}));
  ASSERT_OK(seq->Record(op::SyncToHost{{device, host, both}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*device), ElementsAreArray(values));
  EXPECT_THAT(HostFloats(*host), ElementsAreArray(values));
  EXPECT_THAT(HostFloats(*both), ElementsAreArray(values));
  // On the device too (not only through the copy's host step).
  for (const auto& t : {device, host, storage, both}) {
    SCOPED_TRACE(MemoryTypeName(t->memory_type()));
    ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(t));
    EXPECT_THAT(on_device, ElementsAreArray(values));
  }
}

TEST(Sequence, CopyFromEveryMemoryType) {
  const std::vector<float> values = {7, 8, 9};
  for (MemoryType memory :
       {MemoryType::kDevice, MemoryType::kHost, MemoryType::kStorage, MemoryType::kDeviceAndHost}) {
    SCOPED_TRACE(MemoryTypeName(memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> src, Floats(values, memory));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> dst, Floats({0, 0, 0}, MemoryType::kDevice));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Copy{{src, dst}}));
    ASSERT_OK(seq->Eval(kTimeout));
    ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(dst));
    EXPECT_THAT(on_device, ElementsAreArray(values));
  }
}

TEST(Sequence, CopyCarriesTheSourceHostData) {
  // Documented: after the device copy, the source's host data goes to destinations with staging.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> src, Floats({1, 2}, MemoryType::kDevice));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> dst, Floats({0, 0}, MemoryType::kDevice));
  SetHostFloats(*src, {5, 6});  // host data ahead of the device's {1, 2}
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Copy{{src, dst}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*dst), ElementsAre(5, 6));
  ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(dst));
  EXPECT_THAT(on_device, ElementsAre(1, 2));
}

TEST(Sequence, CopyErrorsRecordNothing) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> f4, Floats({1, 2, 3, 4}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> f3, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> i4,
      Tensor::Create(TestDevice(), ElementType::kInt32, 4, 0, MemoryType::kDevice, nullptr));
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> bytes4x4,
      Tensor::Create(TestDevice(), ElementType::kBytes, 4, 4, MemoryType::kDevice, nullptr));
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> bytes4x8,
      Tensor::Create(TestDevice(), ElementType::kBytes, 4, 8, MemoryType::kDevice, nullptr));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> other_device, Device::Create({}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> other,
                       Floats({1, 2, 3, 4}, MemoryType::kDevice, other_device));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));

  EXPECT_THAT(seq->Record(op::Copy{{f4, i4}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 1"), HasSubstr("int32"), HasSubstr("float32"))));
  EXPECT_THAT(seq->Record(op::Copy{{f4, f3}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 1"), HasSubstr("3 elements"))));
  EXPECT_THAT(seq->Record(op::Copy{{bytes4x4, bytes4x8}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 1")));
  EXPECT_THAT(seq->Record(op::Copy{{f4}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("at least 2"), HasSubstr("got 1"))));
  EXPECT_THAT(seq->Record(op::Copy{}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(seq->Record(op::Copy{{f4, nullptr}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(seq->Record(op::Copy{{f4, other}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another device")));
  EXPECT_FALSE(seq->IsRecording());
  // Nothing was recorded: submitting does nothing.
  ASSERT_OK(seq->Submit());
  EXPECT_FALSE(seq->IsRunning());
  ASSERT_OK(seq->Rerecord());
  EXPECT_FALSE(seq->IsRecording());
}

TEST(Sequence, OtherOpErrorsRecordNothing) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  // A valid op first: the failed ones after it must not disturb it.
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  EXPECT_THAT(seq->Record(op::SyncToDevice{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1")));
  EXPECT_THAT(seq->Record(op::SyncToHost{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 1")));
  EXPECT_THAT(seq->Record(op::SyncToHost{{b, nullptr}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 1")));
  EXPECT_THAT(seq->Record(op::Dispatch{nullptr}), StatusIs(absl::StatusCode::kInvalidArgument));
  op::MemoryBarrier barrier;
  barrier.tensors = {nullptr};
  EXPECT_THAT(seq->Record(barrier), StatusIs(absl::StatusCode::kInvalidArgument));
  // The algorithm has no push constants: an override of 4 bytes is the wrong size.
  EXPECT_THAT(seq->Record(op::Dispatch{add, Bytes(1.0f)}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2));  // one dispatch
}

TEST(Sequence, DispatchPushConstantsOverride) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> affine,
                       MakeAlgorithm(kAffineShader, a, b, Bytes(2.0f, 0.0f)));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{affine}));
    ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
    ASSERT_OK(seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4, 6));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{affine, Bytes(-1.0f, 10.0f)}));
    ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
    ASSERT_OK(seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*b), ElementsAre(9, 8, 7));
  }
  // The override stays with the algorithm.
  EXPECT_EQ(affine->spec().push_constants, Bytes(-1.0f, 10.0f));
  EXPECT_EQ(affine->generation(), 1u);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{affine}));
    ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
    ASSERT_OK(seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*b), ElementsAre(9, 8, 7));
  }
  // Two dispatches with different values in one command buffer: each keeps its own.
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> c, Floats({0, 0, 0}));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> to_c,
                         MakeAlgorithm(kAffineShader, a, c, Bytes(1.0f, 0.0f)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{affine, Bytes(0.0f, 100.0f)}));
    ASSERT_OK(seq->Record(op::Dispatch{to_c, Bytes(0.0f, 200.0f)}));
    ASSERT_OK(seq->Record(op::SyncToHost{{b, c}}));
    ASSERT_OK(seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*b), Each(100.0f));
    EXPECT_THAT(HostFloats(*c), Each(200.0f));
  }
  // A wrong-size override records nothing and leaves the algorithm's values alone.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  EXPECT_THAT(seq->Record(op::Dispatch{affine, Bytes(1.0f)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4 bytes")));
  EXPECT_FALSE(seq->IsRecording());
  EXPECT_EQ(affine->spec().push_constants, Bytes(0.0f, 100.0f));
}

TEST(Sequence, RebuildNeedsRerecord) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       MakeAlgorithm(kAffineShader, a, b, Bytes(2.0f, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4, 6));

  // Rebuilt as b = a * a.
  AlgorithmSpec spec = algorithm->spec();
  ASSERT_OK_AND_ASSIGN(spec.spirv, Compile(kSquareShader));
  spec.push_constants.clear();
  ASSERT_OK(algorithm->Rebuild(spec));
  EXPECT_THAT(seq->Submit(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rerecord")));
  EXPECT_FALSE(seq->IsRunning());
  // Still refused, until...
  EXPECT_THAT(seq->Eval(kTimeout), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(seq->Rerecord());
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 4, 9));
}

TEST(Sequence, RebuildWhileRecordingNeedsRerecord) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       MakeAlgorithm(kAffineShader, a, b, Bytes(2.0f, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  AlgorithmSpec spec = algorithm->spec();
  spec.push_constants = Bytes(3.0f, 0.0f);
  ASSERT_OK(algorithm->Rebuild(spec));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  EXPECT_THAT(seq->Submit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(seq->Rerecord());
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(3, 6, 9));
}

// As in Kompute 0.9: Clear drops the ops and their host steps but keeps the command buffer, which
// Submit still runs until the next Record starts a new one.
TEST(Sequence, ClearKeepsTheCommandBufferWithoutHostSteps) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> c, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::Copy{{a, c}}));
  ASSERT_OK(seq->Clear());
  EXPECT_FALSE(seq->IsRecording());
  EXPECT_FALSE(seq->IsRunning());
  ASSERT_OK(seq->Submit());
  EXPECT_TRUE(seq->IsRunning());
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_FALSE(seq->IsRunning());
  ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(b));
  EXPECT_THAT(on_device, ElementsAre(1, 2));
  ASSERT_OK_AND_ASSIGN(on_device, DeviceFloats(c));
  EXPECT_THAT(on_device, ElementsAre(1, 2));       // the copy ran on the device,
  EXPECT_THAT(HostFloats(*c), ElementsAre(0, 0));  // without its host step

  // Evaluated again, the kept commands run again.
  ASSERT_OK(seq->Eval(kTimeout));
  ASSERT_OK_AND_ASSIGN(on_device, DeviceFloats(b));
  EXPECT_THAT(on_device, ElementsAre(2, 4));

  // The next Record starts a new command buffer: the dispatch is gone.
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2, 4));

  // Rerecord after Clear has nothing to record: nothing is submitted.
  ASSERT_OK(seq->Clear());
  ASSERT_OK(seq->Rerecord());
  ASSERT_OK(seq->Submit());
  EXPECT_FALSE(seq->IsRunning());
}

// A released command buffer is recorded again at the next submission with what was recorded:
// the same push constants (not the algorithm's values since), the same host steps (none after a
// Clear), and timestamps; a sequence that is running or recording keeps its buffer.
TEST(Sequence, ReleasedCommandBufferRunsTheSameCommands) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> c, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> affine,
                       MakeAlgorithm(kAffineShader, a, b, Bytes(2.0f, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 8));
  ASSERT_OK(seq->Record(op::Dispatch{affine, Bytes(2.0f, 1.0f)}));
  EXPECT_FALSE(seq->Release());  // recording
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Record(op::Copy{{b, c}}));
  ASSERT_OK(seq->Submit());
  EXPECT_FALSE(seq->Release());  // running
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_THAT(HostFloats(*c), ElementsAre(3, 5, 7));

  // Not unused since a moment before its last submission: kept.
  EXPECT_FALSE(seq->Release(absl::Now() - absl::Seconds(60)));
  EXPECT_FALSE(seq->IsReleased());

  // Another sequence changes the algorithm's push constants; this one keeps its own.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> other, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(other->Record(op::Dispatch{affine, Bytes(10.0f, 0.0f)}));
  ASSERT_OK(other->Eval(kTimeout));
  EXPECT_TRUE(seq->Release());
  EXPECT_TRUE(seq->IsReleased());
  EXPECT_FALSE(seq->Release());  // nothing left to give back
  SetHostFloats(*c, {0, 0, 0});
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_FALSE(seq->IsReleased());
  EXPECT_THAT(HostFloats(*b), ElementsAre(3, 5, 7));
  EXPECT_THAT(HostFloats(*c), ElementsAre(3, 5, 7));  // the copy's host step ran
  EXPECT_THAT(seq->Timestamps(), SizeIs(4));

  // After a Clear the kept commands run without host steps, released or not.
  ASSERT_OK(seq->Clear());
  EXPECT_TRUE(seq->Release());
  SetHostFloats(*c, {0, 0, 0});
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*c), ElementsAre(0, 0, 0));
  ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(c));
  EXPECT_THAT(on_device, ElementsAre(3, 5, 7));

  // A rebuild is refused after a release as before it, and Rerecord works from a released buffer.
  EXPECT_TRUE(seq->Release());
  AlgorithmSpec spec = affine->spec();
  spec.push_constants = Bytes(1.0f, 0.0f);
  ASSERT_OK(affine->Rebuild(spec));
  EXPECT_THAT(seq->Submit(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rerecord")));
  ASSERT_OK(seq->Record(op::Dispatch{affine}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->End());
  EXPECT_TRUE(seq->Release());
  ASSERT_OK(seq->Rerecord());
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2, 3));
}

// End (Kompute's end()) closes the recording: what was recorded runs; the next Record starts anew.
TEST(Sequence, EndClosesTheRecording) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->End());  // not recording: nothing to end
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  EXPECT_TRUE(seq->IsRecording());
  ASSERT_OK(seq->End());
  EXPECT_FALSE(seq->IsRecording());
  ASSERT_OK(seq->Submit());
  EXPECT_THAT(seq->End(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("running")));
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2));
}

TEST(Sequence, PollSeesTheSubmissionCompleteAndWaitStillCollectsIt) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  EXPECT_TRUE(seq->Poll(absl::ZeroDuration()));  // nothing in flight
  SetHostFloats(*b, {5, 5, 5});
  ASSERT_OK(seq->Record(op::SyncToDevice{{a, b}}));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Submit());
  EXPECT_TRUE(seq->Poll(kTimeout));
  EXPECT_TRUE(seq->IsRunning());  // until Wait has collected the result
  ASSERT_OK(seq->Wait(absl::ZeroDuration()));
  EXPECT_FALSE(seq->IsRunning());
  EXPECT_THAT(HostFloats(*b), ElementsAre(6, 7, 8));
}

TEST(Sequence, NothingRecordedSubmitAndWaitAreOk) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Wait(absl::ZeroDuration()));
  ASSERT_OK(seq->Submit());
  EXPECT_FALSE(seq->IsRunning());
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(seq->Timestamps(), IsEmpty());
}

TEST(Sequence, Timestamps) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 10));
  EXPECT_THAT(seq->Timestamps(), IsEmpty());
  ASSERT_OK(seq->Record(op::SyncToDevice{{a, b}}));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2, 3));
  // One before the first op and one after each op.
  const std::vector<uint64_t> first = seq->Timestamps();
  ASSERT_THAT(first, SizeIs(4));
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end())) << ::testing::PrintToString(first);

  // A re-run gets new timestamps, no earlier than the old ones.
  ASSERT_OK(seq->Eval(kTimeout));
  const std::vector<uint64_t> second = seq->Timestamps();
  ASSERT_THAT(second, SizeIs(4));
  EXPECT_TRUE(std::is_sorted(second.begin(), second.end())) << ::testing::PrintToString(second);
  EXPECT_GE(second.front(), first.back());
}

TEST(Sequence, TimestampsAreCapped) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 2));
  for (int i = 0; i < 4; ++i) ASSERT_OK(seq->Record(op::SyncToHost{{a}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(seq->Timestamps(), SizeIs(2));
}

TEST(Sequence, QueueOutOfRange) {
  const size_t queues = TestDevice()->queue_count();
  EXPECT_THAT(Sequence::Create(TestDevice(), static_cast<uint32_t>(queues), 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("queue index ", queues))));
  EXPECT_THAT(Sequence::Create(TestDevice(), 1000, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1000")));
}

TEST(Sequence, OperationsWhileRunning) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Submit());
  // Running until awaited, whether or not the device has finished.
  EXPECT_TRUE(seq->IsRunning());
  EXPECT_THAT(seq->Record(op::SyncToHost{{b}}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("running")));
  EXPECT_THAT(seq->Submit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(seq->Clear(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(seq->Rerecord(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(seq->Wait(kTimeout));
  EXPECT_FALSE(seq->IsRunning());
  // Idle again: everything works, and nothing refused above was recorded.
  ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2));
}

TEST(Sequence, DestroyedWhileRunning) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
    ASSERT_OK(seq->Record(op::Dispatch{add}));
    ASSERT_OK(seq->Submit());
  }  // waits for the submission before freeing its command buffer
  ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(b));
  EXPECT_THAT(on_device, ElementsAre(1, 2));
}

// A dispatch that takes a while: many invocations of a short loop. Sized for the device type:
// about 0.05-0.1 s on lavapipe with two cores and about 60 ms on an H200.
struct Busy {
  std::shared_ptr<Tensor> out;
  std::shared_ptr<Algorithm> algorithm;
};

absl::StatusOr<Busy> MakeBusy() {
  std::shared_ptr<Device> device = TestDevice();
  const bool cpu = device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  const uint32_t* max = device->limits().maxComputeWorkGroupCount;
  Busy busy;
  absl::StatusOr<std::shared_ptr<Tensor>> out = Floats({0});
  if (!out.ok()) return out.status();
  busy.out = *out;
  absl::StatusOr<std::vector<uint32_t>> spirv = Compile(kBusyShader);
  if (!spirv.ok()) return spirv.status();
  AlgorithmSpec spec;
  spec.tensors = {busy.out};
  spec.spirv = *spirv;
  // 64 invocations per workgroup.
  spec.workgroup =
      cpu ? Workgroup{std::min<uint32_t>(max[0], 16384), 1, 1}
          : Workgroup{std::min<uint32_t>(max[0], 65535), std::min<uint32_t>(max[1], 64), 1};
  spec.push_constants = Bytes(uint32_t{cpu ? 256u : 4096u});
  absl::StatusOr<std::shared_ptr<Algorithm>> algorithm = Algorithm::Create(device, spec);
  if (!algorithm.ok()) return algorithm.status();
  busy.algorithm = *algorithm;
  return busy;
}

TEST(Sequence, WaitWithATinyTimeout) {
  ASSERT_OK_AND_ASSIGN(Busy busy, MakeBusy());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{busy.algorithm}));
  // How long the work takes, waited for in full.
  const absl::Time start = absl::Now();
  ASSERT_OK(seq->Eval(kTimeout));
  const absl::Duration took = absl::Now() - start;
  RecordProperty("busy_dispatch_us", static_cast<int>(absl::ToInt64Microseconds(took)));

  ASSERT_OK(seq->Submit());
  const absl::Status first = seq->Wait(absl::Nanoseconds(1));
  if (took >= absl::Milliseconds(20)) {
    // Work of this length cannot be done 1 ns after the submission returned.
    EXPECT_THAT(first, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not complete")))
        << "the dispatch takes " << took;
  } else {
    EXPECT_THAT(first, AnyOf(StatusIs(absl::StatusCode::kOk),
                             StatusIs(absl::StatusCode::kDeadlineExceeded)))
        << "the dispatch takes " << took;
  }
  if (absl::IsDeadlineExceeded(first)) {
    // Still in flight: no new work can be recorded or submitted.
    EXPECT_TRUE(seq->IsRunning());
    EXPECT_TRUE(seq->InFlight().running);
    EXPECT_NE(seq->InFlight().fence, VK_NULL_HANDLE);
    EXPECT_THAT(seq->Record(op::SyncToHost{{busy.out}}),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(seq->Submit(), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_OK(seq->Wait(absl::Seconds(30)));
  }
  EXPECT_FALSE(seq->IsRunning());
  EXPECT_FALSE(seq->InFlight().running);
  EXPECT_EQ(seq->InFlight().fence, VK_NULL_HANDLE);
  // Completed normally: new work runs.
  ASSERT_OK(seq->Record(op::SyncToHost{{busy.out}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*busy.out), ElementsAre(0.0f));
}

// Validation: the whole path under VK_LAYER_KHRONOS_validation reports no error.
TEST(Sequence, NoValidationErrors) {
  absl::StatusOr<std::shared_ptr<Instance>> instance = ValidationInstance();
  if (absl::IsFailedPrecondition(instance.status())) {
    GTEST_SKIP() << "validation layer not installed: " << instance.status();
  }
  ASSERT_OK(instance.status());
  const uint64_t errors_before = ValidationErrorCount();
  {
    DeviceOptions options;
    options.instance = *instance;
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
    const std::vector<float> values = {1, 2, 3, 4};
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats(values, MemoryType::kDevice, device));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b,
                         Floats({0, 0, 0, 0}, MemoryType::kHost, device));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> c,
                         Floats({0, 0, 0, 0}, MemoryType::kStorage, device));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> d,
                         Floats({0, 0, 0, 0}, MemoryType::kDeviceAndHost, device));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> e,
                         Floats({0, 0, 0, 0}, MemoryType::kDevice, device));
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kAffineShader));
    AlgorithmSpec spec;
    spec.tensors = {a, b};
    spec.spirv = spirv;
    spec.workgroup = {4, 1, 1};
    spec.push_constants = Bytes(2.0f, 1.0f);
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> affine, Algorithm::Create(device, spec));
    ASSERT_OK(affine->SetPushConstants(Bytes(3.0f, 1.0f)));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 8));
    ASSERT_OK(seq->Record(op::SyncToDevice{{a}}));
    ASSERT_OK(seq->Record(op::Dispatch{affine}));
    op::MemoryBarrier barrier;
    barrier.tensors = {b};
    barrier.src_access = VK_ACCESS_SHADER_WRITE_BIT;
    barrier.dst_access = VK_ACCESS_TRANSFER_READ_BIT;
    barrier.src_stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
    barrier.dst_stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
    ASSERT_OK(seq->Record(barrier));
    ASSERT_OK(seq->Record(op::Copy{{b, c, d, e}}));
    ASSERT_OK(seq->Record(op::SyncToHost{{b, d, e}}));
    ASSERT_OK(seq->Eval(kTimeout));
    ASSERT_OK(seq->Eval(kTimeout));  // and once more, re-submitting the same command buffer
    EXPECT_THAT(HostFloats(*b), ElementsAre(4, 7, 10, 13));
    EXPECT_THAT(HostFloats(*d), ElementsAre(4, 7, 10, 13));
    EXPECT_THAT(HostFloats(*e), ElementsAre(4, 7, 10, 13));
    EXPECT_THAT(seq->Timestamps(), SizeIs(6));
    // Rebuild and rerecord.
    spec.push_constants = Bytes(1.0f, 0.0f);
    ASSERT_OK(affine->Rebuild(spec));
    ASSERT_OK(seq->Rerecord());
    ASSERT_OK(seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*e), ElementsAre(1, 2, 3, 4));
    ASSERT_OK(seq->Clear());
  }
  // Everything, the device included, is destroyed by now: objects left alive would be reported
  // too (VUID-vkDestroyDevice-device-00378).
  EXPECT_EQ(ValidationErrorCount(), errors_before);
}

// Creates a device on an instance with the validation layer, or says why there is none.
absl::StatusOr<std::shared_ptr<Device>> ValidatedDevice() {
  absl::StatusOr<std::shared_ptr<Instance>> instance = ValidationInstance();
  if (!instance.ok()) return instance.status();
  DeviceOptions options;
  options.instance = *instance;
  return Device::Create(options);
}

// Several sequences of one queue in one vkQueueSubmit: each runs as if submitted alone, in the
// batch's order on the queue; the last one's fence signals, the others are followed through their
// timeline semaphores; one that cannot be submitted fails alone. Under the validation layer where
// it is installed.
TEST(Sequence, SubmitTogetherRunsEachAndFollowsEachOnItsOwn) {
  absl::StatusOr<std::shared_ptr<Device>> validated = ValidatedDevice();
  const bool validating = validated.ok();
  std::shared_ptr<Device> device = validating ? *validated : TestDevice();
  if (!device->timeline_supported()) GTEST_SKIP() << "the device has no timeline semaphores";
  const uint64_t errors_before = ValidationErrorCount();
  {
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kAddShader));
    struct One {
      std::shared_ptr<Tensor> a, b;
      std::shared_ptr<Algorithm> add;
      std::unique_ptr<Sequence> seq;
    };
    std::vector<One> ones(4);
    for (size_t i = 0; i < ones.size(); ++i) {
      One& one = ones[i];
      const float k = static_cast<float>(i + 1);
      ASSERT_OK_AND_ASSIGN(one.a, Floats({k, 2 * k, 3 * k}, MemoryType::kDevice, device));
      ASSERT_OK_AND_ASSIGN(one.b, Floats({0, 0, 0}, MemoryType::kDevice, device));  // b += a
      AlgorithmSpec spec;
      spec.tensors = {one.a, one.b};
      spec.spirv = spirv;
      spec.workgroup = {3, 1, 1};
      ASSERT_OK_AND_ASSIGN(one.add, Algorithm::Create(device, spec));
      ASSERT_OK_AND_ASSIGN(one.seq, Sequence::Create(device, 0, 0));
      ASSERT_OK(one.seq->Record(op::SyncToDevice{{one.a, one.b}}));
      ASSERT_OK(one.seq->Record(op::Dispatch{one.add}));
      ASSERT_OK(one.seq->Record(op::SyncToHost{{one.b}}));
    }
    // ones[2] is running already; `idle` never recorded anything.
    ASSERT_OK(ones[2].seq->Submit());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> idle, Sequence::Create(device, 0, 0));
    const std::vector<Sequence::Submission> batch = {{ones[0].seq.get()},
                                                     {ones[1].seq.get()},
                                                     {ones[2].seq.get()},
                                                     {idle.get()},
                                                     {ones[3].seq.get()}};
    const std::vector<absl::Status> statuses = Sequence::SubmitTogether(batch);
    ASSERT_THAT(statuses, SizeIs(5));
    EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kOk));
    EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kOk));
    EXPECT_THAT(statuses[2],
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already running")));
    EXPECT_THAT(statuses[3], StatusIs(absl::StatusCode::kOk));
    EXPECT_THAT(statuses[4], StatusIs(absl::StatusCode::kOk));
    EXPECT_FALSE(idle->IsRunning());
    const Sequence::Completion first = ones[0].seq->InFlight();
    const Sequence::Completion second = ones[1].seq->InFlight();
    const Sequence::Completion last = ones[3].seq->InFlight();
    EXPECT_TRUE(first.running && second.running && last.running);
    // Only the last one's fence signals.
    EXPECT_EQ(first.fence, VK_NULL_HANDLE);
    EXPECT_EQ(second.fence, VK_NULL_HANDLE);
    EXPECT_NE(last.fence, VK_NULL_HANDLE);
    EXPECT_EQ(second.order, first.order + 1);
    EXPECT_EQ(last.order, first.order + 2);
    EXPECT_GT(first.order, ones[2].seq->InFlight().order);
    EXPECT_TRUE(ones[1].seq->Poll(kTimeout));  // through its timeline semaphore
    for (One& one : ones) ASSERT_OK(one.seq->Wait(kTimeout));
    for (size_t i = 0; i < ones.size(); ++i) {
      const float k = static_cast<float>(i + 1);
      EXPECT_THAT(HostFloats(*ones[i].b), ElementsAre(k, 2 * k, 3 * k)) << "sequence " << i;
      EXPECT_FALSE(ones[i].seq->IsRunning());
    }
    // Each runs alone again afterwards (the fence of one that went without it included), and
    // together again.
    SetHostFloats(*ones[0].a, {7, 8, 9});
    SetHostFloats(*ones[0].b, {0, 0, 0});
    SetHostFloats(*ones[3].b, {0, 0, 0});
    ASSERT_OK(ones[0].seq->Eval(kTimeout));
    EXPECT_THAT(HostFloats(*ones[0].b), ElementsAre(7, 8, 9));
    for (const absl::Status& s : Sequence::SubmitTogether(
             std::vector<Sequence::Submission>{{ones[3].seq.get()}, {ones[0].seq.get()}})) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kOk));
    }
    EXPECT_EQ(ones[3].seq->InFlight().fence, VK_NULL_HANDLE);
    ASSERT_OK(ones[0].seq->Wait(kTimeout));
    ASSERT_OK(ones[3].seq->Wait(kTimeout));
    EXPECT_THAT(HostFloats(*ones[3].b), ElementsAre(4, 8, 12));
    // A sequence named twice is refused, and nothing is submitted.
    for (const absl::Status& s : Sequence::SubmitTogether(
             std::vector<Sequence::Submission>{{ones[1].seq.get()}, {ones[1].seq.get()}})) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
    }
    EXPECT_FALSE(ones[1].seq->IsRunning());
  }
  if (validating) {
    EXPECT_EQ(ValidationErrorCount(), errors_before);
  }
}

// Bug: op::Copy accepts a tensor copied onto itself (tensors {a, a}); vkCmdCopyBuffer then gets
// overlapping source and destination regions (VUID-vkCmdCopyBuffer-pRegions-00117), which is
// undefined behaviour. Expected: INVALID_ARGUMENT from Record.
TEST(Sequence, CopyOntoItselfIsRejected) {
  absl::StatusOr<std::shared_ptr<Device>> device = ValidatedDevice();
  if (absl::IsFailedPrecondition(device.status())) GTEST_SKIP() << device.status();
  ASSERT_OK(device.status());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}, MemoryType::kDevice, *device));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(*device, 0, 0));
  const uint64_t errors_before = ValidationErrorCount();
  EXPECT_THAT(seq->Record(op::Copy{{a, a}}), StatusIs(absl::StatusCode::kInvalidArgument));
  (void)seq->Eval(kTimeout);
  EXPECT_EQ(ValidationErrorCount(), errors_before);
}

// Bug: Record does not check that a dispatched algorithm belongs to the sequence's device (it
// does for tensors), so another device's pipeline and descriptor set are recorded into this
// device's command buffer. Expected: FAILED_PRECONDITION, as for tensors. (Not submitted here.)
TEST(Sequence, DispatchOfAnotherDevicesAlgorithmIsRejected) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> other, Device::Create({}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kAddShader));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}, MemoryType::kDevice, other));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}, MemoryType::kDevice, other));
  AlgorithmSpec spec;
  spec.tensors = {a, b};
  spec.spirv = spirv;
  spec.workgroup = {2, 1, 1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> foreign, Algorithm::Create(other, spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  EXPECT_THAT(seq->Record(op::Dispatch{foreign}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another device")));
  ASSERT_OK(seq->Clear());  // never submit the foreign handles
}

// Bug: Rerecord validates the ops but applies each Dispatch's push-constant override only while
// re-recording, after resetting the command buffer. When an override no longer fits (the
// algorithm was rebuilt with other push constants), Rerecord fails half-way and leaves the ops
// before it recorded: Submit then runs that partial command buffer. Expected: Rerecord checks
// everything before resetting, so that a failed Rerecord changes nothing and Submit still refuses.
TEST(Sequence, FailedRerecordChangesNothing) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> c, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, MakeAlgorithm(kAddShader, a, b));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> affine,
                       MakeAlgorithm(kAffineShader, a, c, Bytes(1.0f, 0.0f)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{add}));
  ASSERT_OK(seq->Record(op::Dispatch{affine, Bytes(2.0f, 0.0f)}));
  ASSERT_OK(seq->Record(op::SyncToHost{{b, c}}));
  ASSERT_OK(seq->Eval(kTimeout));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1, 2));
  EXPECT_THAT(HostFloats(*c), ElementsAre(2, 4));

  // Rebuilt without push constants: the recorded 8-byte override no longer fits.
  AlgorithmSpec spec = affine->spec();
  ASSERT_OK_AND_ASSIGN(spec.spirv, Compile(kSquareShader));
  spec.push_constants.clear();
  ASSERT_OK(affine->Rebuild(spec));
  EXPECT_THAT(seq->Rerecord(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(seq->Submit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(seq->Wait(kTimeout));
  ASSERT_OK_AND_ASSIGN(std::vector<float> on_device, DeviceFloats(b));
  EXPECT_THAT(on_device, ElementsAre(1, 2));  // the partial command buffer did not run
}

// Regression test (fixed in f148d18): ~Sequence destroyed its timeline semaphore as soon as the
// fence had signalled, while lavapipe (Mesa 22.3) still touches the semaphore after signalling the
// fence; the freed semaphore's mutex was used afterwards and the queue thread blocked for ever
// (every later submission hung) or glibc aborted on a corrupt mutex. Short-lived sequences with
// pipelines kept alive triggered it within a few iterations. On failure the device is leaked, so
// that its stuck queue is never waited for.
TEST(Sequence, ManyShortLivedSequences) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create({}));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kAddShader));
  std::vector<std::shared_ptr<Algorithm>> keep;
  for (int i = 0; i < 30; ++i) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}, MemoryType::kDevice, device));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}, MemoryType::kDevice, device));
    keep.clear();
    for (int j = 0; j < 3; ++j) {
      SCOPED_TRACE(absl::StrCat("iteration ", i, ", sequence ", j));
      AlgorithmSpec spec;
      spec.tensors = {a, b};
      spec.spirv = spirv;
      spec.workgroup = {3, 1, 1};
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> add, Algorithm::Create(device, spec));
      keep.push_back(add);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
      ASSERT_OK(seq->Record(op::Dispatch{add}));
      ASSERT_OK(seq->Record(op::SyncToHost{{b}}));
      const absl::Status s = seq->Eval(absl::Seconds(10));
      if (!s.ok()) {
        ADD_FAILURE() << s;
        seq.release();  // NOLINT: leaked on purpose, see above
        new std::shared_ptr<Device>(device);
        new std::vector<std::shared_ptr<Algorithm>>(keep);
        return;
      }
      EXPECT_THAT(HostFloats(*b), ElementsAre(1 + j, 2 + 2 * j, 3 + 3 * j));
    }
  }
}

}  // namespace
}  // namespace komputed::core
