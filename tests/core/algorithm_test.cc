// Tests of Algorithm: spec validation, rebuilds, specialization and push constants.

#include "komputed/core/algorithm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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
#include "komputed/core/device.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The bytes of `values`, back to back (spec and push constants).
template <typename... T>
std::vector<uint8_t> Bytes(T... values) {
  std::vector<uint8_t> out((sizeof(T) + ... + 0));
  size_t offset = 0;
  ((std::memcpy(out.data() + offset, &values, sizeof(T)), offset += sizeof(T)), ...);
  return out;
}

absl::StatusOr<std::shared_ptr<Tensor>> Floats(const std::vector<float>& values,
                                               MemoryType memory = MemoryType::kDevice) {
  return Tensor::Create(TestDevice(), ElementType::kFloat32, values.size(), 0, memory,
                        values.data());
}

std::vector<float> HostFloats(const Tensor& t) {
  const float* p = static_cast<const float*>(t.host_data());
  return std::vector<float>(p, p + t.count());
}

// CompileGlsl, once per source: compiling takes longer than most tests.
absl::StatusOr<std::vector<uint32_t>> Compile(const char* source) {
  static auto* cache = new std::map<const char*, std::vector<uint32_t>>();
  if (auto it = cache->find(source); it != cache->end()) return it->second;
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(source);
  if (spirv.ok()) (*cache)[source] = *spirv;
  return spirv;
}

// Uploads every tensor, dispatches `algorithm` and downloads every tensor.
absl::Status RoundTrip(const std::shared_ptr<Algorithm>& algorithm,
                       const std::vector<std::shared_ptr<Tensor>>& tensors,
                       const std::shared_ptr<Device>& device = TestDevice()) {
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(device, 0, 0);
  if (!seq.ok()) return seq.status();
  for (Op op : std::vector<Op>{op::SyncToDevice{tensors}, op::Dispatch{algorithm},
                               op::SyncToHost{tensors}}) {
    if (absl::Status s = (*seq)->Record(std::move(op)); !s.ok()) return s;
  }
  return (*seq)->Eval(kTimeout);
}

// b[i] = a[i] * kScale + kAdd, from specialization constants 0 (float) and 1 (int).
constexpr char kSpecShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(constant_id = 0) const float kScale = 1.0;
layout(constant_id = 1) const int kAdd = 0;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = a[i] * kScale + float(kAdd);
}
)";

// b[i] = float(a[i] * kScale) with a double specialization constant.
constexpr char kDoubleSpecShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(constant_id = 0) const double kScale = 1.0;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  b[i] = float(double(a[i]) * kScale);
}
)";

// Does nothing, with no buffers.
constexpr char kNoBufferShader[] = R"(#version 450
layout(local_size_x = 1) in;
void main() {}
)";

// A valid spec for kAffineShader over 4 elements.
struct Fixture {
  std::shared_ptr<Tensor> a;
  std::shared_ptr<Tensor> b;
  AlgorithmSpec spec;
};

absl::StatusOr<Fixture> PushFixture() {
  Fixture f;
  absl::StatusOr<std::shared_ptr<Tensor>> a = Floats({1, 2, 3, 4});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::shared_ptr<Tensor>> b = Floats({0, 0, 0, 0});
  if (!b.ok()) return b.status();
  absl::StatusOr<std::vector<uint32_t>> spirv = Compile(kAffineShader);
  if (!spirv.ok()) return spirv.status();
  f.a = *a;
  f.b = *b;
  f.spec.tensors = {f.a, f.b};
  f.spec.spirv = *spirv;
  f.spec.workgroup = {4, 1, 1};
  f.spec.push_constants = Bytes(2.0f, 0.5f);
  return f;
}

TEST(Algorithm, CreateAndDispatch) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  EXPECT_EQ(algorithm->generation(), 1u);
  const AlgorithmSpec spec = algorithm->spec();
  EXPECT_EQ(spec.spirv, f.spec.spirv);
  EXPECT_EQ(spec.tensors, f.spec.tensors);
  EXPECT_EQ(spec.workgroup.x, 4u);
  EXPECT_EQ(spec.push_constants, f.spec.push_constants);
  ASSERT_OK(RoundTrip(algorithm, {f.a, f.b}));
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(2.5f, 4.5f, 6.5f, 8.5f));
}

TEST(Algorithm, EmptySpirv) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.spirv.clear();
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(Algorithm, InvalidSpirvNeverReachesTheDriver) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  // Not SPIR-V at all.
  f.spec.spirv = {0x12345678, 0, 0, 0, 0, 0};
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not SPIR-V")));
  // SPIR-V cut short: the validator, not the driver, rejects it.
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kAffineShader));
  spirv.resize(spirv.size() / 2);
  f.spec.spirv = spirv;
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid SPIR-V")));
}

TEST(Algorithm, PushConstantsNotAMultipleOf4) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.push_constants = std::vector<uint8_t>(6, 0);
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("6 bytes"), HasSubstr("multiple of 4"))));
}

TEST(Algorithm, PushConstantsOverTheDeviceLimit) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  const uint32_t limit = TestDevice()->limits().maxPushConstantsSize;
  f.spec.push_constants = std::vector<uint8_t>(limit + 4, 0);
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(absl::StrCat(limit + 4, " bytes")),
                             HasSubstr(absl::StrCat(limit)))));
  // Exactly the limit is fine (the shader reads the first 8 bytes).
  f.spec.push_constants = std::vector<uint8_t>(limit, 0);
  EXPECT_TRUE(Algorithm::Create(TestDevice(), f.spec).ok());
}

TEST(Algorithm, WorkgroupOfZero) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.workgroup = {0, 1, 1};
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x=0")));
  f.spec.workgroup = {1, 0, 1};
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("y=0")));
  f.spec.workgroup = {1, 1, 0};
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("z=0")));
}

TEST(Algorithm, WorkgroupOverTheDeviceLimit) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  const uint32_t* limit = TestDevice()->limits().maxComputeWorkGroupCount;
  for (int d = 0; d < 3; ++d) {
    if (limit[d] == UINT32_MAX) continue;  // nothing is over it
    uint32_t wg[3] = {1, 1, 1};
    wg[d] = limit[d] + 1;
    f.spec.workgroup = {wg[0], wg[1], wg[2]};
    EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat(std::string(1, "xyz"[d]), "=", wg[d])),
                               HasSubstr("maxComputeWorkGroupCount"))));
  }
  // The limit itself is accepted.
  f.spec.workgroup = {limit[0], 1, 1};
  EXPECT_TRUE(Algorithm::Create(TestDevice(), f.spec).ok());
}

TEST(Algorithm, SpecConstantsNotAWholeNumber) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.spec_constants = std::vector<uint8_t>(6, 0);
  f.spec.spec_constant_size = 4;
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("6 bytes")));
  f.spec.spec_constants = std::vector<uint8_t>(8, 0);
  f.spec.spec_constant_size = 0;
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Algorithm, NullTensor) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.tensors[1] = nullptr;
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor 1")));
}

TEST(Algorithm, TensorOfAnotherDevice) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> other, Device::Create({}));
  EXPECT_THAT(Algorithm::Create(other, f.spec),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("another device")));
}

TEST(Algorithm, TensorOverMaxStorageBufferRange) {
  const uint64_t range = TestDevice()->limits().maxStorageBufferRange;
  if (range > (uint64_t{1} << 30)) {
    GTEST_SKIP() << "maxStorageBufferRange is " << range << " bytes; a tensor over it is too big";
  }
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> big,
                       Tensor::Create(TestDevice(), ElementType::kFloat32, range / 4 + 1, 0,
                                      MemoryType::kStorage, nullptr));
  f.spec.tensors[1] = big;
  EXPECT_THAT(Algorithm::Create(TestDevice(), f.spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor 1"), HasSubstr("maxStorageBufferRange"))));
}

TEST(Algorithm, NoTensors) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kNoBufferShader));
  AlgorithmSpec spec;
  spec.spirv = spirv;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  ASSERT_OK(seq->Eval(kTimeout));
}

TEST(Algorithm, SetPushConstantsWrongSize) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  EXPECT_THAT(algorithm->SetPushConstants(Bytes(1.0f)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("4 bytes given"), HasSubstr("8 bytes"))));
  EXPECT_THAT(algorithm->SetPushConstants(Bytes(1.0f, 2.0f, 3.0f)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("12 bytes")));
  EXPECT_EQ(algorithm->spec().push_constants, f.spec.push_constants);
  // The right size replaces the values and is no rebuild.
  ASSERT_OK(algorithm->SetPushConstants(Bytes(3.0f, 1.0f)));
  EXPECT_EQ(algorithm->spec().push_constants, Bytes(3.0f, 1.0f));
  EXPECT_EQ(algorithm->push_constants(), Bytes(3.0f, 1.0f));
  EXPECT_EQ(algorithm->generation(), 1u);
}

TEST(Algorithm, RebuildWithBadInputChangesNothing) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  const uint64_t generation = algorithm->generation();

  AlgorithmSpec bad_spirv = f.spec;
  bad_spirv.spirv = {1, 2, 3};
  AlgorithmSpec bad_workgroup = f.spec;
  bad_workgroup.workgroup = {0, 1, 1};
  AlgorithmSpec bad_push = f.spec;
  bad_push.push_constants = {1, 2, 3};
  AlgorithmSpec bad_tensor = f.spec;
  bad_tensor.tensors.push_back(nullptr);
  for (const AlgorithmSpec& bad : {bad_spirv, bad_workgroup, bad_push, bad_tensor}) {
    EXPECT_THAT(algorithm->Rebuild(bad), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(algorithm->generation(), generation);
    const AlgorithmSpec spec = algorithm->spec();
    EXPECT_EQ(spec.spirv, f.spec.spirv);
    EXPECT_EQ(spec.tensors, f.spec.tensors);
    EXPECT_EQ(spec.workgroup.x, f.spec.workgroup.x);
    EXPECT_EQ(spec.push_constants, f.spec.push_constants);
  }
  // The old build still runs.
  ASSERT_OK(RoundTrip(algorithm, {f.a, f.b}));
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(2.5f, 4.5f, 6.5f, 8.5f));
}

TEST(Algorithm, RebuildReplacesEverything) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kSpecShader));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  AlgorithmSpec spec;
  spec.tensors = {a, b};
  spec.spirv = spirv;
  spec.workgroup = {2, 1, 1};
  spec.spec_constants = Bytes(10.0f, int32_t{1});
  ASSERT_OK(algorithm->Rebuild(spec));
  EXPECT_EQ(algorithm->generation(), 2u);
  EXPECT_EQ(algorithm->spec().tensors, spec.tensors);
  EXPECT_EQ(algorithm->tensors(), spec.tensors);
  EXPECT_TRUE(algorithm->spec().push_constants.empty());
  EXPECT_TRUE(algorithm->push_constants().empty());
  ASSERT_OK(RoundTrip(algorithm, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(11.0f, 21.0f));
  // The old tensors were left alone.
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));
}

// Algorithms with the same code, specialisation and layout share one compute pipeline, each
// bound to its own tensors; another specialisation or another scope gets a pipeline of its own,
// and a pipeline goes with the last algorithm that uses it.
TEST(Algorithm, SameCodeSharesOnePipelineWithinAScope) {
  // A device of its own, so that no other test's algorithms are counted.
  DeviceOptions options;
  options.physical_device_index = TestDevice()->info().index;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kSpecShader));
  auto tensor = [&](std::vector<float> values) {
    return Tensor::Create(device, ElementType::kFloat32, values.size(), 0, MemoryType::kDevice,
                          values.data());
  };
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a1, tensor({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b1, tensor({0, 0}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a2, tensor({10, 20}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b2, tensor({0, 0}));
  AlgorithmSpec spec;
  spec.spirv = spirv;
  spec.workgroup = {2, 1, 1};
  spec.spec_constants = Bytes(3.0f, int32_t{1});
  spec.tensors = {a1, b1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> first, Algorithm::Create(device, spec));
  EXPECT_EQ(device->shared_count(), 1u);
  spec.tensors = {a2, b2};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> second, Algorithm::Create(device, spec));
  EXPECT_EQ(device->shared_count(), 1u);
  // Each on its own tensors.
  ASSERT_OK(RoundTrip(first, {a1, b1}, device));
  ASSERT_OK(RoundTrip(second, {a2, b2}, device));
  EXPECT_THAT(HostFloats(*b1), ElementsAre(4.0f, 7.0f));
  EXPECT_THAT(HostFloats(*b2), ElementsAre(31.0f, 61.0f));

  // Another specialisation, and the same one in another scope: pipelines of their own.
  spec.spec_constants = Bytes(-1.0f, int32_t{0});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> other_spec, Algorithm::Create(device, spec));
  EXPECT_EQ(device->shared_count(), 2u);
  spec.spec_constants = Bytes(3.0f, int32_t{1});
  spec.share_scope = "another tenant";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> other_scope, Algorithm::Create(device, spec));
  EXPECT_EQ(device->shared_count(), 3u);
  ASSERT_OK(RoundTrip(other_spec, {a2, b2}, device));
  EXPECT_THAT(HostFloats(*b2), ElementsAre(-10.0f, -20.0f));

  // The shared pipeline outlives the first algorithm, and goes with the second; a rebuild of the
  // second onto the other specialisation shares that one.
  first.reset();
  EXPECT_EQ(device->shared_count(), 3u);
  ASSERT_OK(RoundTrip(second, {a2, b2}, device));
  EXPECT_THAT(HostFloats(*b2), ElementsAre(31.0f, 61.0f));
  spec.share_scope = "";
  spec.spec_constants = Bytes(-1.0f, int32_t{0});
  ASSERT_OK(second->Rebuild(spec));
  EXPECT_EQ(device->shared_count(), 2u);
  ASSERT_OK(RoundTrip(second, {a2, b2}, device));
  EXPECT_THAT(HostFloats(*b2), ElementsAre(-10.0f, -20.0f));
  second.reset();
  other_spec.reset();
  other_scope.reset();
  EXPECT_EQ(device->shared_count(), 0u);
}

TEST(Algorithm, SpecConstantsTakeEffect) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, Compile(kSpecShader));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2, 3}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0, 0}));
  AlgorithmSpec spec;
  spec.tensors = {a, b};
  spec.spirv = spirv;
  spec.workgroup = {3, 1, 1};

  // Without specialization: the shader's defaults (scale 1, add 0).
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> plain, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(plain, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1.0f, 2.0f, 3.0f));

  // Both constants: constant 0 at byte 0 (float), constant 1 at byte 4 (int).
  spec.spec_constants = Bytes(2.5f, int32_t{-3});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> both, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(both, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(-0.5f, 2.0f, 4.5f));

  // Only the first constant: the second keeps its default.
  spec.spec_constants = Bytes(-1.0f);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> first, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(first, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(-1.0f, -2.0f, -3.0f));
}

TEST(Algorithm, EightByteSpecConstants) {
  if (!TestDevice()->float64_supported()) GTEST_SKIP() << "the device has no shaderFloat64";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv,
                       CompileGlsl(kDoubleSpecShader, "double_spec.comp"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  AlgorithmSpec spec;
  spec.tensors = {a, b};
  spec.spirv = spirv;
  spec.workgroup = {2, 1, 1};
  spec.spec_constants = Bytes(0.25);
  spec.spec_constant_size = 8;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(algorithm, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(0.25f, 0.5f));
}

TEST(Algorithm, PushConstantsTakeEffect) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  ASSERT_OK(RoundTrip(algorithm, {f.a, f.b}));
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(2.5f, 4.5f, 6.5f, 8.5f));
  // New values apply to the next recording.
  ASSERT_OK(algorithm->SetPushConstants(Bytes(-1.0f, 10.0f)));
  ASSERT_OK(RoundTrip(algorithm, {f.a, f.b}));
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(9.0f, 8.0f, 7.0f, 6.0f));
}

TEST(Algorithm, KeepsItsTensorsAlive) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  std::weak_ptr<Tensor> weak_b = f.b;
  std::shared_ptr<Tensor> a = f.a;
  f = Fixture();
  ASSERT_FALSE(weak_b.expired());
  std::shared_ptr<Tensor> b = weak_b.lock();
  ASSERT_OK(RoundTrip(algorithm, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAreArray({2.5f, 4.5f, 6.5f, 8.5f}));
}

// ---------------------------------------------------------------------------------------------
// Untrusted shaders: what does not fit the algorithm or the device never reaches the driver.

absl::StatusOr<std::shared_ptr<Tensor>> Uints(const std::vector<uint32_t>& values) {
  return Tensor::Create(TestDevice(), ElementType::kUInt32, values.size(), 0, MemoryType::kDevice,
                        values.data());
}

std::vector<uint32_t> HostUints(const Tensor& t) {
  const uint32_t* p = static_cast<const uint32_t*>(t.host_data());
  return std::vector<uint32_t>(p, p + t.count());
}

// A spec over `tensors` for GLSL `source`, one workgroup. (Not cached: the sources are locals.)
absl::StatusOr<AlgorithmSpec> SpecFor(const char* source,
                                      std::vector<std::shared_ptr<Tensor>> tensors) {
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(source);
  if (!spirv.ok()) return spirv.status();
  AlgorithmSpec spec;
  spec.tensors = std::move(tensors);
  spec.spirv = *std::move(spirv);
  return spec;
}

TEST(Algorithm, BufferReferencesAreRefused) {
  constexpr char kShader[] = R"(#version 450
#extension GL_EXT_buffer_reference : require
layout(local_size_x = 1) in;
layout(buffer_reference, std430) buffer Floats { float v[]; };
layout(set = 0, binding = 0) buffer Pointers { Floats target; };
void main() { target.v[gl_GlobalInvocationID.x] = 1.0; }
)";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Floats({0, 0}));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kShader, {t}));
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("PhysicalStorageBufferAddresses"),
                             HasSubstr("buffer device address"))));
}

TEST(Algorithm, ShaderWithoutComputeMainIsRefused) {
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kNoBufferShader, {}));
  // Rename the entry point: "main" → "mian" (still valid SPIR-V).
  uint32_t main_word = 0;
  std::memcpy(&main_word, "main", 4);
  uint32_t mian_word = 0;
  std::memcpy(&mian_word, "mian", 4);
  for (size_t at = 5; at < spec.spirv.size(); at += spec.spirv[at] >> 16) {
    if ((spec.spirv[at] & 0xffff) == 15 && spec.spirv[at + 3] == main_word) {
      spec.spirv[at + 3] = mian_word;
    }
  }
  ASSERT_OK(ValidateSpirv(spec.spirv, VK_API_VERSION_1_1));
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no GLCompute entry point named 'main'"),
                             HasSubstr("'mian' (GLCompute)"))));
}

TEST(Algorithm, DescriptorsMustBeTheTensors) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> a, Floats({1, 2}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0, 0}));
  // A binding past the tensors.
  constexpr char kBindingTwo[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(set = 0, binding = 2) buffer C { float c[]; };
void main() { c[gl_GlobalInvocationID.x] = a[gl_GlobalInvocationID.x]; }
)";
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kBindingTwo, {a, b}));
  EXPECT_THAT(
      Algorithm::Create(TestDevice(), spec),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("storage buffer (set 0, binding 2)"), HasSubstr("has no tensor"),
                     HasSubstr("2 tensor(s)"), HasSubstr("bindings 0..1"))));
  // Set 1 is the daemon's.
  constexpr char kSetOne[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 1, binding = 0) buffer W { uint word; };
layout(set = 0, binding = 0) buffer A { float a[]; };
void main() { a[0] = float(word); }
)";
  ASSERT_OK_AND_ASSIGN(spec, SpecFor(kSetOne, {a}));
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("descriptor set 1"), HasSubstr("reserved"))));
  // A uniform buffer has no descriptor.
  constexpr char kUniform[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) uniform U { float scale; } params;
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() { b[0] = params.scale; }
)";
  ASSERT_OK_AND_ASSIGN(spec, SpecFor(kUniform, {a, b}));
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("uniform buffer 'params' (set 0, binding 0)"),
                             HasSubstr("storage buffers"))));
  // An array of buffers at one binding.
  constexpr char kArray[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float v[]; } buffers[2];
void main() { buffers[1].v[0] = buffers[0].v[0]; }
)";
  ASSERT_OK_AND_ASSIGN(spec, SpecFor(kArray, {a, b}));
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("array of 2 buffers")));
  // Declared and unused, the same bindings are no error.
  constexpr char kUnused[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 1, binding = 5) buffer W { uint word; };
layout(set = 0, binding = 0) uniform U { float scale; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() { b[0] = 4.0; }
)";
  ASSERT_OK_AND_ASSIGN(spec, SpecFor(kUnused, {a, b}));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(algorithm, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(4.0f, 0.0f));
}

TEST(Algorithm, LocalSizeOverTheDeviceLimits) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() { b[0] = 1.0; }
)";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0}));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kShader, {b}));
  const VkPhysicalDeviceLimits& limits = TestDevice()->limits();
  const uint32_t max_x = limits.maxComputeWorkGroupSize[0];
  spec.spec_constants = Bytes(max_x + 1, uint32_t{1});
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(absl::StrCat("local size x=", max_x + 1)),
                             HasSubstr(absl::StrCat("maxComputeWorkGroupSize x (", max_x)))));
  spec.spec_constants = Bytes(uint32_t{1}, uint32_t{0});
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local size y=0")));
  const uint32_t max_y = limits.maxComputeWorkGroupSize[1];
  if (uint64_t{max_x} * max_y > limits.maxComputeWorkGroupInvocations) {
    spec.spec_constants = Bytes(max_x, max_y);
    EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat(max_x, "x", max_y, "x1")),
                               HasSubstr("maxComputeWorkGroupInvocations"))));
  }
  // Within the limits it builds and runs.
  spec.spec_constants = Bytes(uint32_t{4}, uint32_t{2});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(algorithm, {b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(1.0f));
}

TEST(Algorithm, SharedMemoryOverTheDeviceLimit) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(constant_id = 0) const uint kCount = 16;
layout(set = 0, binding = 0) buffer B { float b[]; };
shared float big[kCount];
void main() {
  big[gl_LocalInvocationIndex] = 2.0;
  barrier();
  b[0] = big[0];
}
)";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> b, Floats({0}));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kShader, {b}));
  const uint32_t limit = TestDevice()->limits().maxComputeSharedMemorySize;
  spec.spec_constants = Bytes(limit / 4 + 1);
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(absl::StrCat((limit / 4 + 1) * 4, " bytes")),
                             HasSubstr(absl::StrCat("maxComputeSharedMemorySize (", limit)))));
  spec.spec_constants = Bytes(limit / 8);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(algorithm, {b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(2.0f));
}

// A shader whose push-constant block is larger than the values given reads zeros past them
// (the pipeline's range covers the block; without that the dispatch is invalid usage).
TEST(Algorithm, PushConstantBlockLargerThanTheValuesReadsZeros) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Out { float o[]; };
layout(push_constant) uniform Push { float a; float b; float c; } push;
void main() { o[0] = push.a; o[1] = push.b; o[2] = push.c; }
)";
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> out, Floats({-1, -1, -1}));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kShader, {out}));
  spec.push_constants = Bytes(5.0f);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> four, Algorithm::Create(TestDevice(), spec));
  EXPECT_EQ(four->push_constant_size(), 4u);  // what the algorithm takes is unchanged
  ASSERT_OK(RoundTrip(four, {out}));
  EXPECT_THAT(HostFloats(*out), ElementsAre(5.0f, 0.0f, 0.0f));
  // None given: all zeros.
  spec.push_constants.clear();
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> none, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(none, {out}));
  EXPECT_THAT(HostFloats(*out), ElementsAre(0.0f, 0.0f, 0.0f));
  // More than the block: the range is the values'.
  spec.push_constants = Bytes(1.0f, 2.0f, 3.0f, 4.0f);
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> more, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(more, {out}));
  EXPECT_THAT(HostFloats(*out), ElementsAre(1.0f, 2.0f, 3.0f));
}

TEST(Algorithm, PushConstantBlockOverTheDeviceLimit) {
  const uint32_t limit = TestDevice()->limits().maxPushConstantsSize;
  const std::string source = absl::StrCat(R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Out { float o[]; };
layout(push_constant) uniform Push { float v[)",
                                          limit / 4 + 1, R"(]; } push;
void main() { o[0] = push.v[0]; }
)");
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(source));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> out, Floats({0}));
  AlgorithmSpec spec;
  spec.tensors = {out};
  spec.spirv = spirv;
  EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr(absl::StrCat("spans ", limit + 4, " bytes")),
                             HasSubstr(absl::StrCat("maxPushConstantsSize (", limit)))));
}

// 64 MiB of garbage words: refused by the validator within seconds, whatever the first word.
TEST(Algorithm, GarbageIsRefusedQuickly) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Floats({0}));
  AlgorithmSpec spec;
  spec.tensors = {t};
  spec.spirv.resize((uint64_t{64} << 20) / 4);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint32_t& w : spec.spirv) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w = static_cast<uint32_t>(x >> 11);
  }
  for (bool with_header : {false, true}) {
    SCOPED_TRACE(with_header ? "with a SPIR-V header" : "raw");
    if (with_header) {
      spec.spirv[0] = 0x07230203u;
      spec.spirv[1] = 0x00010300u;
      spec.spirv[2] = 0;
      spec.spirv[3] = 1000;
      spec.spirv[4] = 0;
    }
    const absl::Time start = absl::Now();
    EXPECT_THAT(Algorithm::Create(TestDevice(), spec),
                StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }
}

// A shader that reads and writes millions of elements past its small buffer reaches neither a
// large tensor beside it (unchanged) nor its secret (never seen).
TEST(Algorithm, OutOfBoundsAccessesStayInTheirBuffers) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Small { uint small[]; };
layout(set = 0, binding = 1) buffer Seen { uint seen[]; };
layout(push_constant) uniform Push { uint stride; } push;
void main() {
  uint i = gl_GlobalInvocationID.x;
  uint far = uint(small.length()) + i * push.stride;
  seen[i] = small[far];
  small[far] = 0xdeadbeefu;
  small[far + 1u] = i;
}
)";
  constexpr uint32_t kSecret = 0x5ec12e75u;
  constexpr uint32_t kInvocations = 64 * 64;
  // The secret first and after: allocations on either side of the small buffer.
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> before,
                       Uints(std::vector<uint32_t>(uint32_t{4} << 20, kSecret)));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> small, Uints(std::vector<uint32_t>(64, 7)));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> seen, Uints(std::vector<uint32_t>(kInvocations, 0)));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> after,
                       Uints(std::vector<uint32_t>(uint32_t{4} << 20, kSecret)));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kShader, {small, seen}));
  spec.workgroup = {kInvocations / 64, 1, 1};
  spec.push_constants = Bytes(uint32_t{1024});  // indices up to 4M, 16 MiB past the buffer
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  ASSERT_OK(seq->Record(op::SyncToDevice{{before, small, seen, after}}));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  ASSERT_OK(seq->Eval(kTimeout));
  // Clear the host copies, then bring back what the device holds.
  for (const auto& t : {before, after}) std::memset(t->host_data(), 0, t->byte_size());
  ASSERT_OK(seq->Clear());
  ASSERT_OK(seq->Record(op::SyncToHost{{before, small, seen, after}}));
  ASSERT_OK(seq->Eval(kTimeout));
  for (const auto& t : {before, after}) {
    const std::vector<uint32_t> values = HostUints(*t);
    EXPECT_EQ(std::count(values.begin(), values.end(), kSecret),
              static_cast<ptrdiff_t>(values.size()));
  }
  for (const auto& t : {small, seen}) {
    const std::vector<uint32_t> values = HostUints(*t);
    EXPECT_EQ(std::count(values.begin(), values.end(), kSecret), 0);
  }
  // Clamped writes land on the small buffer's last element at most.
  const std::vector<uint32_t> small_values = HostUints(*small);
  EXPECT_EQ(std::count(small_values.begin(), small_values.end() - 1, 7u), 63);
}

// Measurements compare the clamped shader with the original: the original still builds.
TEST(Algorithm, ClampingCanBeLeftOutForMeasurements) {
  ASSERT_OK_AND_ASSIGN(Fixture f, PushFixture());
  f.spec.clamp_buffer_accesses = false;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm,
                       Algorithm::Create(TestDevice(), f.spec));
  ASSERT_OK(RoundTrip(algorithm, {f.a, f.b}));
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(2.5f, 4.5f, 6.5f, 8.5f));
}

// Shaders that compute on 8- and 16-bit values, with 8-bit push constants: they need shaderInt8,
// shaderInt16, shaderFloat16 and storagePushConstant8 besides the storage features.
constexpr char kInt8ArithmeticShader[] = R"(#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { int8_t a[]; };
void main() { a[gl_GlobalInvocationID.x] *= int8_t(-3); }
)";
constexpr char kInt16ArithmeticShader[] = R"(#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { uint16_t a[]; };
void main() { a[gl_GlobalInvocationID.x] += uint16_t(65535); }
)";
constexpr char kFloat16ArithmeticShader[] = R"(#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float16_t a[]; };
void main() { a[gl_GlobalInvocationID.x] *= float16_t(0.5); }
)";
constexpr char kPushConstant8Shader[] = R"(#version 450
#extension GL_EXT_shader_8bit_storage : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { int a[]; };
layout(push_constant) uniform Push { int8_t add; } push;
void main() { a[gl_GlobalInvocationID.x] += int(push.add); }
)";

template <typename T>
std::vector<T> HostValues(const Tensor& t) {
  std::vector<T> values(t.count());
  std::memcpy(values.data(), t.host_data(), t.byte_size());
  return values;
}

// Shaders that compute on 8- and 16-bit values run on `device`, which has their features enabled.
void RunSmallTypeArithmetic(const std::shared_ptr<Device>& device) {
  const int8_t i8[] = {5, -7, 100};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t8,
                       Tensor::Create(device, ElementType::kInt8, 3, 0, MemoryType::kDevice, i8));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec8, SpecFor(kInt8ArithmeticShader, {t8}));
  spec8.workgroup = {3, 1, 1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> a8, Algorithm::Create(device, spec8));
  ASSERT_OK(RoundTrip(a8, {t8}, device));
  EXPECT_THAT(HostValues<int8_t>(*t8), ElementsAre(-15, 21, static_cast<int8_t>(-300 + 256)));

  const uint16_t u16[] = {1, 0, 40000};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t16, Tensor::Create(device, ElementType::kUInt16, 3,
                                                                   0, MemoryType::kDevice, u16));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec16, SpecFor(kInt16ArithmeticShader, {t16}));
  spec16.workgroup = {3, 1, 1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> a16, Algorithm::Create(device, spec16));
  ASSERT_OK(RoundTrip(a16, {t16}, device));
  EXPECT_THAT(HostValues<uint16_t>(*t16), ElementsAre(0, 65535, 39999));

  const uint16_t h[] = {0x3C00, 0xC500, 0x0001};  // 1, -5, the least subnormal
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> th,
                       Tensor::Create(device, ElementType::kFloat16, 3, 0, MemoryType::kDevice, h));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spech, SpecFor(kFloat16ArithmeticShader, {th}));
  spech.workgroup = {2, 1, 1};  // (the subnormal's half would depend on the device's rounding)
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> ah, Algorithm::Create(device, spech));
  ASSERT_OK(RoundTrip(ah, {th}, device));
  EXPECT_THAT(HostValues<uint16_t>(*th), ElementsAre(0x3800, 0xC100, 0x0001));  // 0.5, -2.5

  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> ti, Tensor::Create(device, ElementType::kInt32, 2, 0,
                                                                  MemoryType::kDevice, nullptr));
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec specp, SpecFor(kPushConstant8Shader, {ti}));
  specp.workgroup = {2, 1, 1};
  specp.push_constants = Bytes(int8_t{-9}, int8_t{0}, int8_t{0}, int8_t{0});
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> ap, Algorithm::Create(device, specp));
  ASSERT_OK(RoundTrip(ap, {ti}, device));
  EXPECT_THAT(HostValues<int32_t>(*ti), ElementsAre(-9, -9));
}

bool HasSmallTypeFeatures(const ShaderFeatures& f) {
  return f.int8 && f.int16 && f.float16 && f.storage_buffer_8bit && f.storage_buffer_16bit &&
         f.push_constant_8bit;
}

// Where the device has the features, shaders that use them run (the test device's are enabled).
TEST(Algorithm, SmallTypeArithmeticRunsWhereEnabled) {
  if (!HasSmallTypeFeatures(TestDevice()->shader_features())) {
    GTEST_SKIP() << "the device lacks one of the 8/16-bit features";
  }
  RunSmallTypeArithmetic(TestDevice());
}

// The same device opened as a Vulkan 1.1 one: the features found and enabled through 1.1's
// 16-bit storage struct and the extensions VK_KHR_8bit_storage and VK_KHR_shader_float16_int8
// instead of Vulkan 1.2's structs, and without timeline semaphores.
TEST(Algorithm, SmallTypeArithmeticRunsOnTheVulkan11Path) {
  if (TestDevice()->properties().apiVersion < VK_API_VERSION_1_2) {
    GTEST_SKIP() << "the device is a Vulkan 1.1 one already: the test above runs this path";
  }
  DeviceOptions options;
  options.physical_device_index = TestDevice()->info().index;
  options.feature_api_version = VK_API_VERSION_1_1;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  EXPECT_FALSE(device->timeline_supported());
  const std::vector<std::string>& extensions = device->enabled_extensions();
  const ShaderFeatures& all = TestDevice()->shader_features();
  const ShaderFeatures& f = device->shader_features();
  // The 1.1 path finds what the 1.2 path finds, where the device has the two extensions.
  EXPECT_EQ(f.storage_buffer_16bit, all.storage_buffer_16bit);
  EXPECT_EQ(f.push_constant_16bit, all.push_constant_16bit);
  if (f.storage_buffer_8bit) {
    EXPECT_THAT(extensions, Contains("VK_KHR_8bit_storage"));
  }
  if (f.int8 || f.float16) {
    EXPECT_THAT(extensions, Contains("VK_KHR_shader_float16_int8"));
  }
  if (!HasSmallTypeFeatures(f))
    GTEST_SKIP() << "the device lacks VK_KHR_8bit_storage or "
                    "VK_KHR_shader_float16_int8";
  EXPECT_EQ(f.int8, all.int8);
  EXPECT_EQ(f.float16, all.float16);
  EXPECT_EQ(f.storage_buffer_8bit, all.storage_buffer_8bit);
  RunSmallTypeArithmetic(device);
}

// On a device without them (the same device, opened with the features withheld), every shader
// that needs one is refused before the driver sees it, naming the feature; tensors of the small
// types are only bytes and are made all the same.
TEST(Algorithm, SmallTypeShadersNeedTheirFeatures) {
  DeviceOptions options;
  options.physical_device_index = TestDevice()->info().index;
  ShaderFeatures& withheld = options.withheld_features;
  withheld.int8 = withheld.int16 = withheld.float16 = true;
  withheld.storage_buffer_8bit = withheld.storage_buffer_16bit = true;
  withheld.uniform_and_storage_buffer_8bit = withheld.uniform_and_storage_buffer_16bit = true;
  withheld.push_constant_8bit = withheld.push_constant_16bit = true;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> bare, Device::Create(options));
  const ShaderFeatures& f = bare->shader_features();
  EXPECT_FALSE(f.int8 || f.int16 || f.float16 || f.storage_buffer_8bit || f.storage_buffer_16bit ||
               f.uniform_and_storage_buffer_8bit || f.uniform_and_storage_buffer_16bit ||
               f.push_constant_8bit || f.push_constant_16bit);
  EXPECT_EQ(f.float64, TestDevice()->shader_features().float64);  // the rest as ever

  struct Case {
    ElementType type;
    const char* feature;
  };
  for (const Case& c : {Case{ElementType::kInt8, "storageBuffer8BitAccess"},
                        Case{ElementType::kUInt8, "storageBuffer8BitAccess"},
                        Case{ElementType::kInt16, "storageBuffer16BitAccess"},
                        Case{ElementType::kUInt16, "storageBuffer16BitAccess"},
                        Case{ElementType::kFloat16, "storageBuffer16BitAccess"}}) {
    SCOPED_TRACE(ElementTypeName(c.type));
    AlgorithmSpec spec;
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                           Tensor::Create(bare, c.type, 5, 0, MemoryType::kDevice, nullptr));
      spec.tensors.push_back(t);
    }
    ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(c.type));
    spec.spirv.assign(spirv.begin(), spirv.end());
    EXPECT_THAT(Algorithm::Create(bare, spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("needs ", c.feature)),
                               HasSubstr("does not have it enabled"))));
  }

  // Every feature that a shader lacks is named at once.
  {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Tensor::Create(bare, ElementType::kInt8, 4, 0,
                                                                   MemoryType::kDevice, nullptr));
    ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kInt8ArithmeticShader, {t}));
    EXPECT_THAT(Algorithm::Create(bare, spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("capabilities "), HasSubstr("Int8 (39)"),
                               HasSubstr("StorageBuffer8BitAccess (4448)"), HasSubstr("shaderInt8"),
                               HasSubstr("storageBuffer8BitAccess"),
                               HasSubstr("does not have them enabled"))));
  }

  // The features one at a time: with the others enabled, each shader is refused for the one that
  // it lacks.
  struct Arithmetic {
    const char* source;
    ElementType type;
    const char* feature;
  };
  for (const Arithmetic& c :
       {Arithmetic{kInt8ArithmeticShader, ElementType::kInt8, "shaderInt8"},
        Arithmetic{kInt16ArithmeticShader, ElementType::kUInt16, "shaderInt16"},
        Arithmetic{kFloat16ArithmeticShader, ElementType::kFloat16, "shaderFloat16"},
        Arithmetic{kPushConstant8Shader, ElementType::kInt32, "storagePushConstant8"}}) {
    SCOPED_TRACE(c.feature);
    DeviceOptions one;
    one.physical_device_index = TestDevice()->info().index;
    const std::string feature = c.feature;
    one.withheld_features.int8 = feature == "shaderInt8";
    one.withheld_features.int16 = feature == "shaderInt16";
    one.withheld_features.float16 = feature == "shaderFloat16";
    one.withheld_features.push_constant_8bit = feature == "storagePushConstant8";
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(one));
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t,
                         Tensor::Create(device, c.type, 4, 0, MemoryType::kDevice, nullptr));
    ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(c.source, {t}));
    if (c.type == ElementType::kInt32) spec.push_constants = Bytes(int32_t{0});
    EXPECT_THAT(Algorithm::Create(device, spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("needs ", c.feature)),
                               HasSubstr("does not have it enabled"))));
  }
}

// A shader sees a tensor's element count as its length(), also where the tensor's bytes are no
// whole number of 4-byte words (its buffer is padded to one).
TEST(Algorithm, LengthIsTheElementCount) {
  constexpr char kLengths[] = R"(#version 450
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { int8_t a[]; };
layout(set = 0, binding = 1) buffer B { uint16_t b[]; };
layout(set = 0, binding = 2) buffer C { uint8_t c[]; };
layout(set = 0, binding = 3) buffer Out { uint lengths[]; };
void main() {
  lengths[0] = uint(a.length());
  lengths[1] = uint(b.length());
  lengths[2] = uint(c.length());
  lengths[3] = uint(lengths.length());
}
)";
  const ShaderFeatures& f = TestDevice()->shader_features();
  if (!f.storage_buffer_8bit || !f.storage_buffer_16bit) {
    GTEST_SKIP() << "the device lacks 8- or 16-bit storage";
  }
  std::vector<std::shared_ptr<Tensor>> tensors;
  for (auto [type, count] :
       {std::pair{ElementType::kInt8, 5}, std::pair{ElementType::kUInt16, 3},
        std::pair{ElementType::kUInt8, 1}, std::pair{ElementType::kUInt32, 4}}) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Tensor> t, Tensor::Create(TestDevice(), type, count, 0,
                                                                   MemoryType::kDevice, nullptr));
    tensors.push_back(t);
  }
  ASSERT_OK_AND_ASSIGN(AlgorithmSpec spec, SpecFor(kLengths, tensors));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  ASSERT_OK(RoundTrip(algorithm, {tensors[3]}));
  EXPECT_THAT(HostValues<uint32_t>(*tensors[3]), ElementsAre(5, 3, 1, 4));
}

}  // namespace
}  // namespace komputed::core
