// Tests of the shader helpers: GLSL compilation, SPIR-V validation, the built-in shaders.

#include "komputed/core/shader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <iterator>
#include <set>
#include <spirv/unified1/spirv.hpp11>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "komputed/core/spirv_module.h"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr uint32_t kSpirvMagic = 0x07230203u;

// Line 5 has the error (a missing semicolon before "b[i]").
constexpr char kBrokenShader[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x
  b[i] = 1.0;
}
)";

TEST(Shader, CompileGlslReturnsSpirv) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kAddShader));
  ASSERT_GT(spirv.size(), 5u);  // at least the header
  EXPECT_EQ(spirv[0], kSpirvMagic);
  // Compiled for Vulkan 1.1: valid there and on later versions.
  EXPECT_TRUE(ValidateSpirv(spirv, VK_API_VERSION_1_1).ok());
  EXPECT_TRUE(ValidateSpirv(spirv, VK_API_VERSION_1_3).ok());
}

TEST(Shader, CompileGlslSyntaxError) {
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(kBrokenShader, "broken.comp");
  EXPECT_THAT(spirv, StatusIs(absl::StatusCode::kInvalidArgument,
                              AllOf(HasSubstr("broken.comp:"), HasSubstr("error"))));
  // The compiler reports the line where it noticed the error: the one after the missing ';'.
  EXPECT_THAT(spirv, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broken.comp:6")));
}

TEST(Shader, CompileGlslSemanticErrorNamesTheLine) {
  constexpr char kUndeclared[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() {
  b[0] = undeclared_variable;
}
)";
  EXPECT_THAT(CompileGlsl(kUndeclared, "undeclared.comp"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("undeclared.comp:5"), HasSubstr("error"),
                             HasSubstr("undeclared_variable"))));
}

TEST(Shader, CompileGlslDefines) {
  constexpr char kDefined[] = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { ELEMENT b[]; };
void main() { b[gl_GlobalInvocationID.x] = ELEMENT(VALUE); }
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv,
                       CompileGlsl(kDefined, "defined.comp", {"ELEMENT=uint", "VALUE=3"}));
  EXPECT_EQ(spirv[0], kSpirvMagic);
  // Without the definitions the source does not compile.
  EXPECT_THAT(CompileGlsl(kDefined, "defined.comp"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("defined.comp")));
}

TEST(Shader, CompileGlslWithoutMain) {
  EXPECT_THAT(CompileGlsl("#version 450\nlayout(local_size_x = 1) in;\n", "nomain.comp"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Shader, ValidateSpirvEmpty) {
  EXPECT_THAT(ValidateSpirv({}, VK_API_VERSION_1_1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

TEST(Shader, ValidateSpirvGarbage) {
  const std::vector<uint32_t> garbage = {0xdeadbeef, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_THAT(ValidateSpirv(garbage, VK_API_VERSION_1_1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deadbeef")));
}

TEST(Shader, ValidateSpirvGarbageAfterTheMagic) {
  const std::vector<uint32_t> garbage = {kSpirvMagic, 0xffffffff, 0xffffffff, 0xffffffff,
                                         0xffffffff,  0xffffffff, 0xffffffff};
  EXPECT_THAT(ValidateSpirv(garbage, VK_API_VERSION_1_1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid SPIR-V")));
}

TEST(Shader, ValidateSpirvTruncated) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kAddShader));
  for (size_t keep : {size_t{1}, size_t{5}, spirv.size() / 2, spirv.size() - 1}) {
    SCOPED_TRACE(absl::StrCat(keep, " of ", spirv.size(), " words"));
    EXPECT_THAT(ValidateSpirv(absl::MakeConstSpan(spirv).first(keep), VK_API_VERSION_1_1),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST(Shader, MultiplyShaderForEveryNumericType) {
  std::set<std::vector<uint32_t>> distinct;
  for (ElementType type : kMultiplyTypes) {
    SCOPED_TRACE(ElementTypeName(type));
    ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(type));
    ASSERT_FALSE(spirv.empty());
    EXPECT_EQ(spirv[0], kSpirvMagic);
    EXPECT_THAT(ValidateSpirv(spirv, VK_API_VERSION_1_1), StatusIs(absl::StatusCode::kOk));
    // The robust-access pass takes it, and its result is valid.
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> clamped,
                         ClampBufferAccesses(spirv, VK_API_VERSION_1_1));
    EXPECT_THAT(ValidateSpirv(clamped, VK_API_VERSION_1_1), StatusIs(absl::StatusCode::kOk));
    EXPECT_EQ(ShaderLocalSize(spirv, {}, 4), (std::array<uint64_t, 3>{kMultiplyLocalSize, 1, 1}));
    distinct.insert(std::vector<uint32_t>(spirv.begin(), spirv.end()));
  }
  EXPECT_EQ(distinct.size(), std::size(kMultiplyTypes));
}

// The 8- and 16-bit multiplies only load and store their elements: they need the storage features
// and none of the arithmetic ones (Int8, Int16, Float16).
TEST(Shader, SmallTypeMultipliesNeedOnlyStorageCapabilities) {
  struct Case {
    ElementType type;
    spv::Capability storage;
  };
  for (const Case& c : {Case{ElementType::kInt8, spv::Capability::StorageBuffer8BitAccess},
                        Case{ElementType::kUInt8, spv::Capability::StorageBuffer8BitAccess},
                        Case{ElementType::kInt16, spv::Capability::StorageBuffer16BitAccess},
                        Case{ElementType::kUInt16, spv::Capability::StorageBuffer16BitAccess},
                        Case{ElementType::kFloat16, spv::Capability::StorageBuffer16BitAccess}}) {
    SCOPED_TRACE(ElementTypeName(c.type));
    ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(c.type));
    const SpirvModule module = SpirvModule::Parse(spirv);
    EXPECT_THAT(module.capabilities(),
                UnorderedElementsAre(static_cast<uint32_t>(spv::Capability::Shader),
                                     static_cast<uint32_t>(c.storage)));
  }
}

// The multiply's grid stays within 65535 workgroups per dimension and covers every element.
TEST(Shader, MultiplyWorkgroupCoversAnyCount) {
  using Grid = std::array<uint32_t, 3>;
  auto grid = [](uint64_t count) {
    absl::StatusOr<Grid> g = MultiplyWorkgroup(count);
    EXPECT_TRUE(g.ok()) << count << ": " << g.status();
    return g.ok() ? *g : Grid{0, 0, 0};
  };
  EXPECT_EQ(grid(1), (Grid{1, 1, 1}));
  EXPECT_EQ(grid(256), (Grid{1, 1, 1}));
  EXPECT_EQ(grid(257), (Grid{2, 1, 1}));
  EXPECT_EQ(grid(65535ull * 256), (Grid{65535, 1, 1}));
  EXPECT_EQ(grid(65535ull * 256 + 1), (Grid{65535, 2, 1}));
  EXPECT_EQ(grid(10'000'000), (Grid{39063, 1, 1}));
  EXPECT_EQ(grid(UINT32_MAX), (Grid{65535, 257, 1}));
  EXPECT_THAT(MultiplyWorkgroup(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MultiplyWorkgroup(uint64_t{UINT32_MAX} + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4294967296")));
  EXPECT_EQ(kMultiplyLocalSize, 256u);
  ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> spirv, MultiplyShader(ElementType::kFloat32));
  EXPECT_EQ(ShaderLocalSize(spirv, {}, 4), (std::array<uint64_t, 3>{kMultiplyLocalSize, 1, 1}));
}

TEST(Shader, MultiplyShaderForOtherTypes) {
  EXPECT_THAT(MultiplyShader(ElementType::kBool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bool")));
  EXPECT_THAT(MultiplyShader(ElementType::kBytes),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
}

// The local size a dispatch quota counts: from main's execution mode, or from the WorkgroupSize
// built-in with its specialization constants applied.
TEST(Shader, LocalSizeOfMain) {
  constexpr char kLiteral[] = R"(#version 450
layout(local_size_x = 8, local_size_y = 4, local_size_z = 2) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() { b[gl_GlobalInvocationID.x] = 1.0; }
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> literal, CompileGlsl(kLiteral));
  EXPECT_EQ(ShaderLocalSize(literal, {}, 4), (std::array<uint64_t, 3>{8, 4, 2}));

  constexpr char kSpecialized[] = R"(#version 450
layout(local_size_x_id = 0, local_size_y = 3) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() { b[gl_GlobalInvocationID.x] = 1.0; }
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> specialized, CompileGlsl(kSpecialized));
  EXPECT_EQ(ShaderLocalSize(specialized, {}, 4), (std::array<uint64_t, 3>{1, 3, 1}));
  const uint32_t x = 64;
  const auto* bytes = reinterpret_cast<const uint8_t*>(&x);
  EXPECT_EQ(ShaderLocalSize(specialized, std::vector<uint8_t>(bytes, bytes + 4), 4),
            (std::array<uint64_t, 3>{64, 3, 1}));
  // Garbage and truncated modules give some size without reading past their end.
  std::vector<uint32_t> truncated(literal.begin(), literal.begin() + literal.size() / 2);
  ShaderLocalSize(truncated, {}, 4);
  std::vector<uint32_t> junk(64, 0xffffffffu);
  ShaderLocalSize(junk, {}, 4);
  EXPECT_EQ(ShaderLocalSize({}, {}, 4), (std::array<uint64_t, 3>{1, 1, 1}));
}

// The reflection of a module: what the intake checks read.
TEST(SpirvModule, ReadsWhatTheChecksNeed) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x = 16, local_size_y = 2) in;
layout(set = 0, binding = 0) readonly buffer In { float values[]; } in_buffer;
layout(set = 0, binding = 3) buffer Out { float out_values[4]; };
layout(set = 2, binding = 1) uniform Params { float unused_scale; };
struct Inner { vec2 pair; float tail; };
layout(push_constant) uniform Push {
  vec3 v;        // offset 0, 12 bytes
  float f;       // offset 12
  mat4 m;        // offset 16, 64 bytes
  float list[3]; // offset 80, stride 4
  Inner inner;   // offset 96: pair at 96, tail at 104
} push;
shared float tile[64];
shared uvec4 quads[8];
void main() {
  uint i = gl_LocalInvocationIndex;
  tile[i % 64] = in_buffer.values[i];
  quads[i % 8] = uvec4(i);
  barrier();
  out_values[i % 4] = tile[(i + 1) % 64] * push.f + push.m[0][0] + push.list[2] + push.inner.tail +
                      float(quads[0].x) + push.v.x;
}
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kShader));
  const SpirvModule m = SpirvModule::Parse(spirv);
  EXPECT_EQ(m.version(), spirv[1]);
  EXPECT_THAT(m.capabilities(), Contains(1u));  // Shader
  EXPECT_EQ(m.addressing_model(), 0u);          // Logical
  EXPECT_THAT(m.ext_inst_imports(), Contains("GLSL.std.450"));
  ASSERT_NE(m.ComputeMain(), nullptr);
  EXPECT_EQ(m.ComputeMain()->name, "main");
  EXPECT_FALSE(m.uses_physical_storage_buffer());
  ASSERT_EQ(m.bindings().size(), 3u);
  const SpirvBinding& in = m.bindings()[0];
  EXPECT_EQ(in.name, "in_buffer");
  EXPECT_EQ(in.set, 0u);
  EXPECT_EQ(in.binding, 0u);
  EXPECT_EQ(in.kind, DescriptorKind::kStorageBuffer);
  EXPECT_TRUE(in.runtime_array);
  EXPECT_TRUE(in.used);
  EXPECT_EQ(in.descriptor_count, 1u);
  const SpirvBinding& out = m.bindings()[1];
  EXPECT_EQ(out.binding, 3u);
  EXPECT_FALSE(out.runtime_array);
  EXPECT_TRUE(out.used);
  const SpirvBinding& params = m.bindings()[2];
  EXPECT_EQ(params.set, 2u);
  EXPECT_EQ(params.binding, 1u);
  EXPECT_EQ(params.kind, DescriptorKind::kUniformBuffer);
  EXPECT_FALSE(params.used);
  EXPECT_TRUE(m.has_push_constants());
  EXPECT_EQ(m.PushConstantBytes({}), 108u);
  EXPECT_EQ(m.SharedMemoryBytes({}), 64u * 4 + 8u * 16);
  EXPECT_EQ(m.LocalSize({}), (std::array<uint64_t, 3>{16, 2, 1}));
}

TEST(SpirvModule, SpecializedSizes) {
  constexpr char kShader[] = R"(#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint kTile = 32;
layout(constant_id = 2) const uint kRows = 2;
layout(set = 0, binding = 0) buffer Out { float out_values[]; };
shared float tile[kTile * kRows + 1u];
void main() {
  tile[gl_LocalInvocationIndex] = 1.0;
  barrier();
  out_values[gl_GlobalInvocationID.x] = tile[0];
}
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kShader));
  const SpirvModule m = SpirvModule::Parse(spirv);
  EXPECT_EQ(m.SharedMemoryBytes({}), (32u * 2 + 1) * 4);
  const uint32_t values[] = {128, 100, 3};
  const SpecConstants spec{{reinterpret_cast<const uint8_t*>(values), sizeof(values)}, 4};
  EXPECT_EQ(m.SharedMemoryBytes(spec), (100u * 3 + 1) * 4);
  EXPECT_EQ(m.LocalSize(spec), (std::array<uint64_t, 3>{128, 1, 1}));
  EXPECT_FALSE(m.has_push_constants());
  EXPECT_EQ(m.PushConstantBytes(spec), 0u);
}

TEST(SpirvModule, BufferReferencesAreSeen) {
  constexpr char kShader[] = R"(#version 450
#extension GL_EXT_buffer_reference : require
layout(local_size_x = 1) in;
layout(buffer_reference, std430) buffer Floats { float v[]; };
layout(push_constant) uniform Push { Floats target; } push;
void main() { push.target.v[gl_GlobalInvocationID.x] = 1.0; }
)";
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kShader));
  const SpirvModule m = SpirvModule::Parse(spirv);
  EXPECT_TRUE(m.uses_physical_storage_buffer());
  EXPECT_THAT(m.capabilities(), Contains(5347u));  // PhysicalStorageBufferAddresses
  EXPECT_EQ(m.PushConstantBytes({}), 8u);
}

TEST(SpirvModule, AnyWordsAreReadWithoutFaulting) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kAddShader));
  for (size_t keep = 0; keep < spirv.size(); keep += 3) {
    const SpirvModule m = SpirvModule::Parse(absl::MakeConstSpan(spirv).first(keep));
    m.LocalSize({});
    m.PushConstantBytes({});
    m.SharedMemoryBytes({});
  }
  std::vector<uint32_t> junk(4096);
  uint32_t x = 12345;
  for (uint32_t& w : junk) w = (x = x * 1103515245u + 12345u);
  junk[0] = kSpirvMagic;
  const SpirvModule m = SpirvModule::Parse(junk);
  m.LocalSize({});
  m.PushConstantBytes({});
  m.SharedMemoryBytes({});
}

// The clamped module is valid and keeps what it declares.
TEST(Shader, ClampBufferAccessesKeepsAValidModule) {
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> spirv, CompileGlsl(kAffineShader));
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> clamped,
                       ClampBufferAccesses(spirv, VK_API_VERSION_1_1));
  EXPECT_NE(clamped, spirv);
  ASSERT_OK(ValidateSpirv(clamped, VK_API_VERSION_1_1));
  const SpirvModule before = SpirvModule::Parse(spirv), after = SpirvModule::Parse(clamped);
  EXPECT_EQ(after.bindings().size(), before.bindings().size());
  EXPECT_EQ(after.PushConstantBytes({}), before.PushConstantBytes({}));
  EXPECT_THAT(after.capabilities(), Not(Contains(5347u)));
}

}  // namespace
}  // namespace komputed::core
