// Tests of Algorithm: spec validation, rebuilds, specialization and push constants.

#include "komputed/core/algorithm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
                       const std::vector<std::shared_ptr<Tensor>>& tensors) {
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
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
  EXPECT_TRUE(algorithm->spec().push_constants.empty());
  ASSERT_OK(RoundTrip(algorithm, {a, b}));
  EXPECT_THAT(HostFloats(*b), ElementsAre(11.0f, 21.0f));
  // The old tensors were left alone.
  EXPECT_THAT(HostFloats(*f.b), ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));
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

}  // namespace
}  // namespace komputed::core
