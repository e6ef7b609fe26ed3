// Tests of LoopOverWorkgroups: a dispatch run as a loop over fewer workgroups computes exactly
// what the whole dispatch computes, for every id a shader can read, and stays valid SPIR-V.

#include "komputed/core/workgroup_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <shaderc/shaderc.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/cancel_check.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/status.h"
#include "komputed/core/tensor.h"
#include "spirv-tools/optimizer.hpp"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::ElementsAreArray;

// Every id an invocation can read, written at its own place: 12 words per invocation.
constexpr char kIdsShader[] = R"(#version 450
layout(local_size_x = 4, local_size_y = 2, local_size_z = 1) in;
layout(set = 0, binding = 0) buffer Out { uint v[]; };
void main() {
  uvec3 size = gl_NumWorkGroups * gl_WorkGroupSize;
  uvec3 g = gl_GlobalInvocationID;
  uint at = 12u * (g.x + size.x * (g.y + size.y * g.z));
  v[at + 0u] = gl_WorkGroupID.x;
  v[at + 1u] = gl_WorkGroupID.y;
  v[at + 2u] = gl_WorkGroupID.z;
  v[at + 3u] = g.x;
  v[at + 4u] = g.y;
  v[at + 5u] = g.z;
  v[at + 6u] = gl_NumWorkGroups.x;
  v[at + 7u] = gl_NumWorkGroups.y;
  v[at + 8u] = gl_NumWorkGroups.z;
  v[at + 9u] = gl_LocalInvocationIndex;
  v[at + 10u] = gl_LocalInvocationID.x;
  v[at + 11u] += 1u;  // how many times the invocation ran: once
}
)";

// Shared memory: each workgroup reverses its slice of the input through a shared array, and
// invocations of every third workgroup return early, before the barrier-free tail.
constexpr char kSharedShader[] = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { uint v[]; };
shared uint s[64];
void main() {
  uint l = gl_LocalInvocationID.x;
  uint i = gl_GlobalInvocationID.x;
  s[l] = i * 3u + 1u;
  barrier();
  uint r = s[63u - l];
  if (gl_WorkGroupID.x % 3u == 2u) return;
  v[i] = r;
}
)";

// The local size from a specialization constant, and the global id read by a function of its own.
constexpr char kSpecializedShader[] = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer Out { uint v[]; };
uint Where() { return gl_GlobalInvocationID.x; }
void main() {
  uint i = Where();
  for (uint k = 0u; k < 3u; ++k) v[i] += k + 1u;
}
)";

// kSpecializedShader's local size, as its specialization constant 0.
std::vector<uint8_t> LocalSizeConstant(uint32_t local) {
  std::vector<uint8_t> bytes(sizeof(local));
  std::memcpy(bytes.data(), &local, sizeof(local));
  return bytes;
}

std::vector<uint32_t> Compile(const char* source) {
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(source);
  EXPECT_TRUE(spirv.ok()) << spirv.status();
  return spirv.ok() ? *spirv : std::vector<uint32_t>{};
}

struct Ran {
  std::vector<uint32_t> out;
  Workgroup dispatched;
};

// Runs `spirv` over one uint tensor of `words` words, zero-filled, and returns the tensor.
absl::StatusOr<Ran> RunLooped(std::vector<uint32_t> spirv, size_t words, Workgroup groups,
                              uint32_t resident, std::vector<uint8_t> spec_constants = {},
                              std::shared_ptr<CancelWord> word = nullptr) {
  std::vector<uint32_t> zeros(words, 0);
  KD_ASSIGN_OR_RETURN(std::shared_ptr<Tensor> t,
                      Tensor::Create(TestDevice(), ElementType::kUInt32, words, 0,
                                     MemoryType::kDevice, zeros.data()));
  AlgorithmSpec spec;
  spec.tensors = {t};
  spec.spirv = std::move(spirv);
  spec.workgroup = groups;
  spec.spec_constants = std::move(spec_constants);
  spec.resident_workgroups = resident;
  spec.cancel = std::move(word);
  KD_ASSIGN_OR_RETURN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(TestDevice(), spec));
  KD_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq, Sequence::Create(TestDevice(), 0, 0));
  for (Op op : {Op(op::SyncToDevice{{t}}), Op(op::Dispatch{algorithm}), Op(op::SyncToHost{{t}})}) {
    KD_RETURN_IF_ERROR(seq->Record(std::move(op)));
  }
  KD_RETURN_IF_ERROR(seq->Eval(kTimeout));
  Ran ran;
  ran.out.resize(words);
  std::memcpy(ran.out.data(), t->host_data(), words * 4);
  ran.dispatched = algorithm->dispatched();
  return ran;
}

TEST(WorkgroupLoop, EveryIdIsTheWholeDispatchs) {
  const std::vector<uint32_t> spirv = Compile(kIdsShader);
  // Resident counts below, at and above the x count, dividing the total and not.
  for (Workgroup groups : {Workgroup{5, 3, 2}, Workgroup{3, 7, 1}, Workgroup{1, 4, 5}}) {
    const size_t words = 12u * groups.x * groups.y * groups.z * 8u;
    ASSERT_OK_AND_ASSIGN(Ran whole, RunLooped(spirv, words, groups, 0));
    EXPECT_EQ(whole.dispatched.x, groups.x);
    for (size_t at = 11; at < words; at += 12) ASSERT_EQ(whole.out[at], 1u) << at;
    for (uint32_t resident : {1u, 2u, 4u, 5u, 7u, 11u}) {
      SCOPED_TRACE(testing::Message()
                   << groups.x << "x" << groups.y << "x" << groups.z << " over " << resident);
      ASSERT_OK_AND_ASSIGN(Ran looped, RunLooped(spirv, words, groups, resident));
      EXPECT_EQ(looped.dispatched.x, resident);
      EXPECT_EQ(looped.dispatched.y, 1u);
      EXPECT_EQ(looped.dispatched.z, 1u);
      EXPECT_THAT(looped.out, ElementsAreArray(whole.out));
    }
  }
}

TEST(WorkgroupLoop, ADispatchWithinTheBoundIsLeftAsItIs) {
  ASSERT_OK_AND_ASSIGN(Ran ran, RunLooped(Compile(kIdsShader), 12u * 6 * 8, {3, 2, 1}, 6));
  EXPECT_EQ(ran.dispatched.x, 3u);
  EXPECT_EQ(ran.dispatched.y, 2u);
}

TEST(WorkgroupLoop, SharedMemoryAndEarlyReturnsKeepTheirResults) {
  constexpr uint32_t kGroups = 37;
  std::vector<uint32_t> want(kGroups * 64, 0);
  for (uint32_t g = 0; g < kGroups; ++g) {
    if (g % 3 == 2) continue;
    for (uint32_t l = 0; l < 64; ++l) want[g * 64 + l] = (g * 64 + 63 - l) * 3 + 1;
  }
  const std::vector<uint32_t> spirv = Compile(kSharedShader);
  for (uint32_t resident : {0u, 1u, 3u, 8u}) {
    SCOPED_TRACE(resident);
    ASSERT_OK_AND_ASSIGN(Ran ran, RunLooped(spirv, want.size(), {kGroups, 1, 1}, resident));
    EXPECT_THAT(ran.out, ElementsAreArray(want));
  }
}

// A module for Vulkan 1.3, where a specialised local size is an OpExecutionModeId LocalSizeId
// (and no WorkgroupSize constant).
std::vector<uint32_t> CompileForVulkan13(const char* source) {
  shaderc::Compiler compiler;
  shaderc::CompileOptions options;
  options.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_3);
  shaderc::SpvCompilationResult result =
      compiler.CompileGlslToSpv(source, shaderc_compute_shader, "shader.comp", options);
  EXPECT_EQ(result.GetCompilationStatus(), shaderc_compilation_status_success)
      << result.GetErrorMessage();
  return {result.cbegin(), result.cend()};
}

// The local size from a specialization constant, both as Vulkan 1.0 modules give it (a
// WorkgroupSize constant) and as Vulkan 1.3 ones do (LocalSizeId; where the device runs them).
TEST(WorkgroupLoop, ASpecializedLocalSizeAndIdsReadByOtherFunctions) {
  std::vector<std::vector<uint32_t>> modules = {Compile(kSpecializedShader)};
  if (TestDevice()->properties().apiVersion >= VK_API_VERSION_1_3) {
    modules.push_back(CompileForVulkan13(kSpecializedShader));
  }
  const uint32_t local = 16;
  for (const std::vector<uint32_t>& spirv : modules) {
    ASSERT_OK_AND_ASSIGN(Ran ran,
                         RunLooped(spirv, 10 * local, {10, 1, 1}, 3, LocalSizeConstant(local)));
    EXPECT_EQ(ran.dispatched.x, 3u);
    EXPECT_THAT(ran.out, ElementsAreArray(std::vector<uint32_t>(10 * local, 6)));
  }
}

TEST(WorkgroupLoop, LoopedModulesAreValidWithAndWithoutCancelChecksAndOptimization) {
  const uint32_t api = TestDevice()->properties().apiVersion;
  for (const char* source : {kIdsShader, kSharedShader, kSpecializedShader}) {
    std::vector<uint32_t> spirv = Compile(source);
    std::vector<uint32_t> optimized;
    spvtools::Optimizer optimizer(SPV_ENV_VULKAN_1_1);
    optimizer.RegisterPerformancePasses();
    ASSERT_TRUE(optimizer.Run(spirv.data(), spirv.size(), &optimized));
    for (const std::vector<uint32_t>* module : {&spirv, &optimized}) {
      ASSERT_OK_AND_ASSIGN(LoopedModule looped, LoopOverWorkgroups(*module, {{9, 2, 3}, 4}));
      absl::Status valid = ValidateSpirv(looped.spirv, api);
      EXPECT_TRUE(valid.ok()) << valid;
      // As Algorithm::Create adds the checks to a looped module, and as another might.
      CancelCheckOptions as_algorithms;
      as_algorithms.check_entry = false;
      as_algorithms.entry_checked_functions = {looped.body};
      as_algorithms.unchecked_loop_functions = {looped.main};
      for (const CancelCheckOptions& options : {CancelCheckOptions{}, as_algorithms}) {
        ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> stoppable,
                             AddCancelChecks(looped.spirv, options));
        valid = ValidateSpirv(stoppable, api);
        EXPECT_TRUE(valid.ok()) << valid;
      }
    }
  }
  // And the optimized, looped, stoppable module computes what the plain one does.
  std::vector<uint32_t> spirv = Compile(kIdsShader);
  std::vector<uint32_t> optimized;
  spvtools::Optimizer optimizer(SPV_ENV_VULKAN_1_1);
  optimizer.RegisterPerformancePasses();
  ASSERT_TRUE(optimizer.Run(spirv.data(), spirv.size(), &optimized));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  const size_t words = 12u * 7 * 3 * 2 * 8;
  ASSERT_OK_AND_ASSIGN(Ran whole, RunLooped(spirv, words, {7, 3, 2}, 0));
  ASSERT_OK_AND_ASSIGN(Ran looped, RunLooped(optimized, words, {7, 3, 2}, 5, {}, word));
  EXPECT_EQ(looped.dispatched.x, 5u);
  EXPECT_THAT(looped.out, ElementsAreArray(whole.out));
}

TEST(WorkgroupLoop, ASetCancelWordStopsALoopedDispatch) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  word->Set();
  const uint32_t local = 16;
  // A module with a loop: the body that the new main calls checks the word first.
  ASSERT_OK_AND_ASSIGN(Ran looped, RunLooped(Compile(kSpecializedShader), 10 * local, {10, 1, 1}, 3,
                                             LocalSizeConstant(local), word));
  EXPECT_EQ(looped.dispatched.x, 3u);
  EXPECT_THAT(looped.out, ElementsAreArray(std::vector<uint32_t>(10 * local, 0)));
}

TEST(WorkgroupLoop, BadOptionsAndModulesAreRefused) {
  const std::vector<uint32_t> spirv = Compile(kIdsShader);
  EXPECT_THAT(LoopOverWorkgroups(spirv, {{4, 1, 1}, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LoopOverWorkgroups(spirv, {{4, 1, 1}, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LoopOverWorkgroups(spirv, {{0, 1, 1}, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LoopOverWorkgroups(std::vector<uint32_t>{0x07230203u, 0x10000}, {{4, 1, 1}, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Dispatches whose loop counters could wrap are left as they are.
  EXPECT_THAT(LoopOverWorkgroups(spirv, {{0x80000000u, 1, 1}, 64}),
              StatusIs(absl::StatusCode::kUnimplemented));
  ASSERT_OK(LoopOverWorkgroups(spirv, {{0x7fffffffu, 65535, 65535}, 64}).status());
  std::vector<uint32_t> truncated(spirv.begin(), spirv.end() - 3);
  EXPECT_THAT(LoopOverWorkgroups(truncated, {{4, 1, 1}, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A string literal's padding after its NUL need not be zero: the validator takes "main" padded
// with a non-zero byte, and the rewrites read the name and the interface after it as it does.
TEST(WorkgroupLoop, AnEntryPointNamePaddedWithGarbageIsReadAsTheValidatorReadsIt) {
  std::vector<uint32_t> spirv = Compile(kIdsShader);
  size_t at = 5;
  while (at < spirv.size() && (spirv[at] & 0xffff) != 15) at += spirv[at] >> 16;  // OpEntryPoint
  ASSERT_LT(at, spirv.size());
  ASSERT_EQ(spirv[at + 3], 0x6e69616du);  // "main"
  ASSERT_EQ(spirv[at + 4], 0u);           // its NUL and padding
  spirv[at + 4] = 0xfd000000u;            // the NUL, then a padding byte that is not zero
  const uint32_t api = TestDevice()->properties().apiVersion;
  ASSERT_OK(ValidateSpirv(spirv, api));
  ASSERT_OK_AND_ASSIGN(LoopedModule looped, LoopOverWorkgroups(spirv, {{9, 2, 3}, 4}));
  absl::Status valid = ValidateSpirv(looped.spirv, api);
  EXPECT_TRUE(valid.ok()) << valid;
  ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> stoppable, AddCancelChecks(spirv));
  valid = ValidateSpirv(stoppable, api);
  EXPECT_TRUE(valid.ok()) << valid;
}

TEST(WorkgroupLoop, ADeviceOfGivenSlotsLoopsLargeDispatchesByItself) {
  DeviceOptions options;
  options.dispatch_share = 0.5;
  options.invocation_slots = 4096;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> device, Device::Create(options));
  EXPECT_EQ(device->resident_invocations(), 4096u);
  const uint64_t subgroup = std::max<uint32_t>(device->subgroup_size(), 1);
  // 2048 slots at a time: whole subgroups per workgroup, and at least two.
  EXPECT_EQ(device->ResidentWorkgroupLimit(256), 2048 / std::max<uint64_t>(256, 2 * subgroup));
  EXPECT_EQ(device->ResidentWorkgroupLimit(1), 2048 / (2 * subgroup));
  EXPECT_EQ(device->ResidentWorkgroupLimit(1 << 20), 1u);
  EXPECT_EQ(device->ResidentWorkgroupLimit(256, 1.0), 0u);

  // A dispatch of 40 workgroups of 64 (2560 invocations) is looped by the algorithm itself, on a
  // GPU.
  const uint32_t words = 40 * 64;
  std::vector<uint32_t> zeros(words, 0);
  ASSERT_OK_AND_ASSIGN(
      std::shared_ptr<Tensor> t,
      Tensor::Create(device, ElementType::kUInt32, words, 0, MemoryType::kDevice, zeros.data()));
  const uint32_t local = 64;
  AlgorithmSpec spec;
  spec.tensors = {t};
  spec.spirv = Compile(kSpecializedShader);
  spec.spec_constants = LocalSizeConstant(local);
  spec.workgroup = {40, 1, 1};
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(device, spec));
  if (device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    EXPECT_EQ(algorithm->dispatched().x, 40u);  // a CPU device takes no bound by itself
  } else {
    EXPECT_EQ(algorithm->dispatched().x, device->ResidentWorkgroupLimit(64));
    EXPECT_LT(algorithm->dispatched().x, 40u);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
  for (Op op : {Op(op::SyncToDevice{{t}}), Op(op::Dispatch{algorithm}), Op(op::SyncToHost{{t}})}) {
    ASSERT_OK(seq->Record(std::move(op)));
  }
  ASSERT_OK(seq->Eval(kTimeout));
  std::vector<uint32_t> out(words);
  std::memcpy(out.data(), t->host_data(), words * 4);
  EXPECT_THAT(out, ElementsAreArray(std::vector<uint32_t>(words, 6)));
}

TEST(WorkgroupLoop, DevicesThatDoNotReportTheirComputeUnitsSetNoBound) {
  const Device& device = *TestDevice();
  if (device.resident_invocations() != 0) {
    // A GPU: half its slots hold at least one workgroup and fewer of larger ones.
    DeviceOptions options;
    options.dispatch_share = 0.5;
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> shared, Device::Create(options));
    std::printf("%s: %llu resident invocations, subgroups of %u\n", device.properties().deviceName,
                static_cast<unsigned long long>(device.resident_invocations()),
                device.subgroup_size());
    const uint32_t small = shared->ResidentWorkgroupLimit(64);
    const uint32_t large = shared->ResidentWorkgroupLimit(1024);
    EXPECT_GE(large, 1u);
    EXPECT_GT(small, large);
    EXPECT_EQ(device.ResidentWorkgroupLimit(64), 0u);  // the default share, 1, sets none
    return;
  }
  EXPECT_EQ(device.ResidentWorkgroupLimit(64), 0u);
  DeviceOptions options;
  options.dispatch_share = 0.5;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Device> shared, Device::Create(options));
  EXPECT_EQ(shared->ResidentWorkgroupLimit(64), 0u);
}

}  // namespace
}  // namespace komputed::core
