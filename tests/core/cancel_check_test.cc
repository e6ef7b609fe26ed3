// Tests of AddCancelChecks and CancelWord: rewritten modules stay valid and compute the same, and a
// set word stops a running dispatch.

#include "komputed/core/cancel_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/sequence.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "spirv-tools/optimizer.hpp"
#include "support/status_matchers.h"
#include "test_device.h"

namespace komputed::core {
namespace {

using ::testing::Each;
using ::testing::ElementsAreArray;

// Loops of every form that GLSL has, with values that live across them (OpPhi in merge blocks).
constexpr char kLoopsShader[] = R"(#version 450
layout(local_size_x = 4) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
float prefix(uint n) {
  float s = 0.0;
  for (uint k = 0; k < n; ++k) s += a[k];
  return s;
}
void main() {
  uint i = gl_GlobalInvocationID.x;
  float total = prefix(i + 1);
  uint k = 0;
  while (k < i) { k++; if (k == 100) break; }
  do { total += 0.0; k += 1; } while (k < i + 2);
  for (uint x = 0; x < 3; ++x) {
    if (x == 1) continue;
    for (uint y = 0; y < 2; ++y) { total += 0.0; }
    switch (x) { case 0: total += 0.0; break; default: break; }
  }
  for (;;) { if (k > 0) break; }
  b[i] = total + float(k - i - 2);
}
)";

// A module of the Vulkan memory model (the word's atomic load takes another scope there).
constexpr char kMemoryModelShader[] = R"(#version 450
#pragma use_vulkan_memory_model
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer Out { uint v[]; };
void main() {
  for (uint k = 0u; k < v[0]; ++k) { v[k + 1u] = k; }
}
)";

// A module that reads the workgroup's id itself (the checks share its variable), signed.
constexpr char kWorkgroupIdShader[] = R"(#version 450
layout(local_size_x = 8) in;
layout(set = 0, binding = 0) buffer Out { int v[]; };
void main() {
  ivec3 g = ivec3(gl_WorkGroupID);
  for (int k = 0; k < g.x; ++k) v[g.x * 8 + int(gl_LocalInvocationID.x)] += k + g.y;
}
)";

// A loop that never ends (on a GPU; lavapipe ends any loop after about 65535 iterations).
constexpr char kEndlessShader[] = R"(#version 450
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer Out { uint v[]; };
void main() {
  for (;;) {}
}
)";

std::vector<uint32_t> Compile(const char* source) {
  absl::StatusOr<std::vector<uint32_t>> spirv = CompileGlsl(source);
  EXPECT_TRUE(spirv.ok()) << spirv.status();
  return spirv.ok() ? *spirv : std::vector<uint32_t>{};
}

std::shared_ptr<Tensor> Floats(const std::vector<float>& values, MemoryType memory) {
  absl::StatusOr<std::shared_ptr<Tensor>> t =
      Tensor::Create(TestDevice(), ElementType::kFloat32, values.size(), 0, memory, values.data());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : nullptr;
}

std::vector<float> HostFloats(const Tensor& t) {
  std::vector<float> v(t.count());
  std::memcpy(v.data(), t.host_data(), t.byte_size());
  return v;
}

TEST(CancelChecks, RewrittenModulesAreValid) {
  const uint32_t api = TestDevice()->properties().apiVersion;
  for (const char* source : {kLoopsShader, kAddShader, kAffineShader, kBusyShader, kEndlessShader,
                             kMemoryModelShader, kWorkgroupIdShader}) {
    std::vector<uint32_t> spirv = Compile(source);
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> stoppable, AddCancelChecks(spirv));
    EXPECT_GT(stoppable.size(), spirv.size());
    ASSERT_OK(ValidateSpirv(stoppable, api));
  }
  for (ElementType type : kMultiplyTypes) {
    SCOPED_TRACE(ElementTypeName(type));
    ASSERT_OK_AND_ASSIGN(absl::Span<const uint32_t> multiply, MultiplyShader(type));
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> stoppable, AddCancelChecks(multiply));
    ASSERT_OK(ValidateSpirv(stoppable, api));
  }
}

// Runs `spirv` over a (read) and b (written) with the cancel word in place; returns b.
absl::StatusOr<std::vector<float>> RunWithWord(std::vector<uint32_t> spirv,
                                               std::shared_ptr<CancelWord> word,
                                               const std::vector<float>& a, Workgroup groups) {
  std::shared_ptr<Tensor> ta = Floats(a, MemoryType::kDevice);
  std::shared_ptr<Tensor> tb = Floats(std::vector<float>(a.size(), -1.0f), MemoryType::kDevice);
  AlgorithmSpec spec;
  spec.tensors = {ta, tb};
  spec.spirv = std::move(spirv);
  spec.workgroup = groups;
  spec.cancel = std::move(word);
  absl::StatusOr<std::shared_ptr<Algorithm>> algorithm = Algorithm::Create(TestDevice(), spec);
  if (!algorithm.ok()) return algorithm.status();
  absl::StatusOr<std::unique_ptr<Sequence>> seq = Sequence::Create(TestDevice(), 0, 0);
  if (!seq.ok()) return seq.status();
  for (Op op :
       {Op(op::SyncToDevice{{ta, tb}}), Op(op::Dispatch{*algorithm}), Op(op::SyncToHost{{tb}})}) {
    absl::Status s = (*seq)->Record(std::move(op));
    if (!s.ok()) return s;
  }
  absl::Status s = (*seq)->Eval(kTimeout);
  if (!s.ok()) return s;
  return HostFloats(*tb);
}

// Loops as an optimizer leaves them: a do-while becomes one block that is its loop's header,
// continue target and back edge, which the rewrite splits.
constexpr char kOptimizedLoopsShader[] = R"(#version 450
layout(local_size_x = 4) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  float acc = 0.0;
  uint k = 0u;
  do { acc = acc * 0.5 + a[k % 8u]; k++; } while (k < i + 3u);
  for (uint j = 0u; j < i; ++j) acc += 1.0;
  b[i] = acc;
}
)";

std::vector<uint32_t> Optimized(const std::vector<uint32_t>& spirv) {
  spvtools::Optimizer optimizer(SPV_ENV_VULKAN_1_3);
  optimizer.RegisterPerformancePasses();
  std::vector<uint32_t> out;
  EXPECT_TRUE(optimizer.Run(spirv.data(), spirv.size(), &out));
  return out;
}

// Whether some block of `spirv` names itself as its loop's continue target.
bool HasSingleBlockLoop(const std::vector<uint32_t>& spirv) {
  uint32_t label = 0;
  for (size_t at = 5; at < spirv.size() && (spirv[at] >> 16) > 0; at += spirv[at] >> 16) {
    const uint32_t op = spirv[at] & 0xffff;
    if (op == 248) label = spirv[at + 1];                  // OpLabel
    if (op == 246 && spirv[at + 2] == label) return true;  // OpLoopMerge
  }
  return false;
}

TEST(CancelChecks, OptimizedLoopsKeepTheirResultsAtEveryInterval) {
  const std::vector<uint32_t> spirv = Optimized(Compile(kOptimizedLoopsShader));
  ASSERT_TRUE(HasSingleBlockLoop(spirv));
  const uint32_t api = TestDevice()->properties().apiVersion;
  for (uint32_t interval : {1u, 3u, 256u}) {
    SCOPED_TRACE(interval);
    CancelCheckOptions options;
    options.interval = interval;
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> stoppable, AddCancelChecks(spirv, options));
    ASSERT_OK(ValidateSpirv(stoppable, api));
    options.check_entry = false;
    ASSERT_OK_AND_ASSIGN(stoppable, AddCancelChecks(spirv, options));
    ASSERT_OK(ValidateSpirv(stoppable, api));
  }
  EXPECT_THAT(AddCancelChecks(spirv, CancelCheckOptions{.interval = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Through Algorithm (the default interval), against the same sums on the host.
  std::vector<float> a(40);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5);
  std::vector<float> want(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    float acc = 0;
    uint32_t k = 0;
    do {
      acc = acc * 0.5f + a[k % 8];
      ++k;
    } while (k < i + 3);
    for (size_t j = 0; j < i; ++j) acc += 1.0f;
    want[i] = acc;
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  ASSERT_OK_AND_ASSIGN(std::vector<float> b, RunWithWord(spirv, word, a, {10, 1, 1}));
  EXPECT_THAT(b, ElementsAreArray(want));
}

TEST(CancelChecks, OnlyLoopFreeModulesHaveAnInstructionBound) {
  ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> add, LoopFreeInstructionBound(Compile(kAddShader)));
  ASSERT_TRUE(add.has_value());
  EXPECT_GT(*add, 5u);
  EXPECT_LT(*add, 100u);
  ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> loops,
                       LoopFreeInstructionBound(Compile(kLoopsShader)));
  EXPECT_FALSE(loops.has_value());
  // Calls count their callee each time.
  ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> calls,
                       LoopFreeInstructionBound(Compile(R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
float f(float x) { return x * x + 1.0; }
float g(float x) { return f(f(x)) + f(x); }
void main() { b[0] = g(g(b[0])); }
)")));
  ASSERT_TRUE(calls.has_value());
  EXPECT_GT(*calls, 4u * 3u * 4u);  // main calls g twice, each g calls f three times
}

// A small loop-free dispatch runs to its end even with the word set (it ends soon by itself, and
// each invocation spared the read of the word at its start); a large one is checked at entry.
TEST(CancelChecks, OnlyADispatchThatCouldRunLongIsCheckedAtEntry) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  word->Set();
  const std::vector<float> a(64, 2.0f);
  ASSERT_OK_AND_ASSIGN(std::vector<float> small,
                       RunWithWord(Compile(kAddShader), word, a, {64, 1, 1}));
  EXPECT_THAT(small, Each(1.0f));  // -1 + 2: every invocation ran
  // Enough workgroups that the bound passes UncheckedWorkLimit (the accesses are clamped into
  // the 64 elements, so all would add into them).
  const VkPhysicalDeviceLimits& limits = TestDevice()->limits();
  ASSERT_OK_AND_ASSIGN(std::optional<uint64_t> per_invocation,
                       LoopFreeInstructionBound(Compile(kAddShader)));
  const uint64_t groups_needed = UncheckedWorkLimit(*TestDevice()) /
                                     (*per_invocation * limits.maxComputeWorkGroupInvocations) +
                                 1;
  const uint32_t x = static_cast<uint32_t>(std::min<uint64_t>(groups_needed, 65535));
  const uint32_t y = static_cast<uint32_t>((groups_needed + x - 1) / x);
  ASSERT_LE(y, limits.maxComputeWorkGroupCount[1]);
  ASSERT_OK_AND_ASSIGN(std::vector<float> large,
                       RunWithWord(Compile(kAddShader), word, a, {x, y, 1}));
  EXPECT_THAT(large, Each(-1.0f));  // no invocation ran past its first check
}

TEST(CancelChecks, MalformedModulesAreRefused) {
  EXPECT_THAT(AddCancelChecks(std::vector<uint32_t>{0x07230203u, 0x10000}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<uint32_t> spirv = Compile(kAddShader);
  spirv.push_back(0xffff0000u | 59);  // an instruction that runs past the end
  EXPECT_THAT(AddCancelChecks(spirv), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CancelChecks, ResultsAreUnchangedWhileTheWordIsClear) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  EXPECT_FALSE(word->set());
  std::vector<float> a(64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7);
  std::vector<float> want(a.size());
  float sum = 0;
  for (size_t i = 0; i < a.size(); ++i) want[i] = sum += a[i];
  ASSERT_OK_AND_ASSIGN(std::vector<float> b,
                       RunWithWord(Compile(kLoopsShader), word, a, {16, 1, 1}));
  EXPECT_THAT(b, ElementsAreArray(want));
}

TEST(CancelChecks, ASetWordSkipsEveryInvocation) {
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(TestDevice()));
  word->Set();
  EXPECT_TRUE(word->set());
  // b keeps what it held: no invocation ran past its first check.
  ASSERT_OK_AND_ASSIGN(std::vector<float> b, RunWithWord(Compile(kLoopsShader), word,
                                                         std::vector<float>(64, 1.0f), {16, 1, 1}));
  EXPECT_THAT(b, Each(-1.0f));
}

TEST(CancelWords, ShareASlabAndKeepToTheirOwnSlot) {
  std::shared_ptr<Device> device = TestDevice();
  // Words made together share their slab while it has room: distinct, aligned offsets.
  std::vector<std::shared_ptr<CancelWord>> words;
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> w, CancelWord::Create(device));
    words.push_back(std::move(w));
  }
  const uint64_t alignment = device->limits().minStorageBufferOffsetAlignment;
  absl::flat_hash_set<uint64_t> offsets;
  for (const auto& w : words) {
    EXPECT_EQ(w->offset() % alignment, 0u);
    offsets.insert(w->offset());
  }
  EXPECT_EQ(offsets.size(), words.size());
  if (alignment <= kCancelWordStrideBytes / 4) {
    absl::flat_hash_set<VkBuffer> buffers;
    for (const auto& w : words) buffers.insert(w->buffer());
    EXPECT_LE(buffers.size(), 2u) << "four words fit in a slab (another one's last free slot)";
  }
  // Setting one stops dispatches that read it, and no other word.
  words[1]->Set();
  EXPECT_FALSE(words[0]->set());
  EXPECT_TRUE(words[1]->set());
  EXPECT_FALSE(words[2]->set());
  const std::vector<float> a(64, 1.0f);
  ASSERT_OK_AND_ASSIGN(std::vector<float> stopped,
                       RunWithWord(Compile(kLoopsShader), words[1], a, {16, 1, 1}));
  EXPECT_THAT(stopped, Each(-1.0f));
  ASSERT_OK_AND_ASSIGN(std::vector<float> ran,
                       RunWithWord(Compile(kLoopsShader), words[2], a, {16, 1, 1}));
  EXPECT_THAT(ran, Each(testing::Ne(-1.0f)));
  // A set word's slot, once the word is gone, is handed out again clear.
  const VkBuffer buffer = words[1]->buffer();
  const uint64_t offset = words[1]->offset();
  words[1].reset();
  std::vector<std::shared_ptr<CancelWord>> more;
  std::shared_ptr<CancelWord> again;
  for (int i = 0; i < 256 && again == nullptr; ++i) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> w, CancelWord::Create(device));
    if (w->buffer() == buffer && w->offset() == offset) again = w;
    more.push_back(std::move(w));
  }
  ASSERT_NE(again, nullptr) << "the freed slot was not handed out again";
  EXPECT_FALSE(again->set());
  ASSERT_OK_AND_ASSIGN(std::vector<float> after,
                       RunWithWord(Compile(kLoopsShader), again, a, {16, 1, 1}));
  EXPECT_THAT(after, Each(testing::Ne(-1.0f)));
}

// Busy work that counts the invocations that ran their loop to its end.
constexpr char kCountedBusyShader[] = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Out { uint finished; float sink; };
layout(push_constant) uniform Params { uint iterations; } params;
void main() {
  float acc = float(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y);
  for (uint k = 0; k < params.iterations; ++k) acc = acc * 0.999 + 1.0;
  atomicAdd(finished, 1u);
  if (acc == -12345.0) sink = acc;
}
)";

TEST(CancelChecks, SettingTheWordStopsARunningDispatch) {
  // Minutes of work on lavapipe (and on a GPU): 65535 x 16 workgroups of 64 invocations, each
  // looping 60000 times (6 million on a GPU). Stopped, most invocations never finish their loop;
  // how long the dispatch takes to wind down is for komputed_watchdog_bench (a loaded or sanitized
  // lavapipe takes a minute), so the wait here only bounds a hang.
  std::shared_ptr<Device> device = TestDevice();
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(device));
  std::shared_ptr<Tensor> out = Floats(std::vector<float>(4, 0.0f), MemoryType::kDevice);
  AlgorithmSpec spec;
  spec.tensors = {out};
  spec.spirv = Compile(kCountedBusyShader);
  spec.workgroup = {65535, 16, 1};
  const uint64_t invocations = uint64_t{65535} * 16 * 64;
  // (A GPU runs all of it in about a second at 60000: there each loop is a hundred times longer.)
  const uint32_t iterations =
      device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 60000 : 6000000;
  spec.push_constants.resize(4);
  std::memcpy(spec.push_constants.data(), &iterations, 4);
  spec.cancel = word;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(device, spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
  ASSERT_OK(seq->Record(op::SyncToDevice{{out}}));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  ASSERT_OK(seq->Record(op::SyncToHost{{out}}));
  ASSERT_OK(seq->Submit());
  EXPECT_THAT(seq->Wait(absl::Milliseconds(500)), StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Time set_at = absl::Now();
  word->Set();
  ASSERT_OK(seq->Wait(absl::Minutes(5)));
  std::printf("a set cancel word ended the dispatch after %s\n",
              absl::FormatDuration(absl::Now() - set_at).c_str());
  std::vector<float> host = HostFloats(*out);
  uint32_t finished = 0;
  std::memcpy(&finished, host.data(), sizeof(finished));
  std::printf("%u of %llu invocations ran their loop to its end\n", finished,
              static_cast<unsigned long long>(invocations));
  EXPECT_LT(finished, invocations / 2);
}

TEST(CancelChecks, SettingTheWordEndsAnEndlessLoop) {
  std::shared_ptr<Device> device = TestDevice();
  if (device->properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    GTEST_SKIP() << "lavapipe ends every loop by itself";
  }
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CancelWord> word, CancelWord::Create(device));
  std::shared_ptr<Tensor> out = Floats(std::vector<float>(4, 0.0f), MemoryType::kDevice);
  AlgorithmSpec spec;
  spec.tensors = {out};
  spec.spirv = Compile(kEndlessShader);
  spec.workgroup = {1024, 1, 1};
  spec.cancel = word;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<Algorithm> algorithm, Algorithm::Create(device, spec));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Sequence> seq, Sequence::Create(device, 0, 0));
  ASSERT_OK(seq->Record(op::Dispatch{algorithm}));
  ASSERT_OK(seq->Submit());
  absl::Status early = seq->Wait(absl::Seconds(1));
  const absl::Time set_at = absl::Now();
  word->Set();  // always, so that a failure here does not leave the kernel running
  EXPECT_THAT(early, StatusIs(absl::StatusCode::kDeadlineExceeded));
  ASSERT_OK(seq->Wait(absl::Seconds(20)));
  std::printf("a set cancel word ended an endless loop after %s\n",
              absl::FormatDuration(absl::Now() - set_at).c_str());
}

}  // namespace
}  // namespace komputed::core
