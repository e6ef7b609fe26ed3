#pragma once
// A SPIR-V module taken apart for rewriting: its header, the instructions before the first
// function, and each function's blocks. The rewrites of shaders before they reach the driver
// (cancel_check.cc, workgroup_loop.cc) edit modules through it.

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace komputed::core::spirv {

// Opcodes, enumerants and decorations of the SPIR-V specification.
inline constexpr uint32_t kOpUndef = 1, kOpLine = 8, kOpExtension = 10, kOpMemoryModel = 14,
                          kOpEntryPoint = 15, kOpExecutionMode = 16, kOpCapability = 17,
                          kOpExtInst = 12, kOpDecorationGroup = 73, kOpExecutionModeId = 331,
                          kOpTypeVoid = 19, kOpTypeBool = 20, kOpTypeInt = 21, kOpTypeVector = 23,
                          kOpTypeArray = 28, kOpTypeStruct = 30, kOpTypePointer = 32,
                          kOpTypeFunction = 33, kOpConstantTrue = 41, kOpConstant = 43,
                          kOpConstantComposite = 44, kOpSpecConstantComposite = 51,
                          kOpFunction = 54, kOpFunctionParameter = 55, kOpFunctionEnd = 56,
                          kOpFunctionCall = 57, kOpVariable = 59, kOpLoad = 61, kOpStore = 62,
                          kOpAccessChain = 65, kOpInBoundsAccessChain = 66, kOpDecorate = 71,
                          kOpMemberDecorate = 72, kOpCompositeConstruct = 80,
                          kOpCompositeExtract = 81, kOpCopyObject = 83, kOpUDiv = 134,
                          kOpUMod = 137, kOpBitcast = 124, kOpIAdd = 128, kOpISub = 130,
                          kOpIMul = 132, kOpLogicalOr = 166, kOpLogicalAnd = 167,
                          kOpLogicalNot = 168, kOpSelect = 169, kOpIEqual = 170, kOpULessThan = 176,
                          kOpUGreaterThanEqual = 174, kOpBitwiseAnd = 199, kOpAtomicLoad = 227,
                          kOpControlBarrier = 224, kOpPhi = 245, kOpLoopMerge = 246,
                          kOpSelectionMerge = 247, kOpLabel = 248, kOpBranch = 249,
                          kOpBranchConditional = 250, kOpSwitch = 251, kOpReturn = 253,
                          kOpReturnValue = 254, kOpUnreachable = 255, kOpNoLine = 317;
inline constexpr uint32_t kCapabilityVulkanMemoryModel = 5345;
inline constexpr uint32_t kStorageInput = 1, kStorageWorkgroup = 4, kStoragePrivate = 6,
                          kStorageFunction = 7, kStorageBuffer = 12;
inline constexpr uint32_t kGLCompute = 5, kAddressingLogical = 0;
inline constexpr uint32_t kExecutionModeLocalSize = 17, kExecutionModeLocalSizeId = 38;
inline constexpr uint32_t kBuiltInNumWorkgroups = 24, kBuiltInWorkgroupSize = 25,
                          kBuiltInWorkgroupId = 26, kBuiltInLocalInvocationId = 27,
                          kBuiltInGlobalInvocationId = 28;
inline constexpr uint32_t kDecorationBlock = 2, kDecorationArrayStride = 6, kDecorationBuiltIn = 11,
                          kDecorationBinding = 33, kDecorationDescriptorSet = 34,
                          kDecorationOffset = 35;
inline constexpr uint32_t kScopeDevice = 1, kScopeWorkgroup = 2, kScopeQueueFamily = 5;
inline constexpr uint32_t kSemanticsRelaxed = 0, kSemanticsAcquireRelease = 0x8,
                          kSemanticsWorkgroupMemory = 0x100;

// Layout sections before the types: capabilities ... debug names, annotations.
bool IsBeforeTypes(uint32_t op);
bool IsTerminator(uint32_t op);

using Inst = std::vector<uint32_t>;  // one instruction, its first word (count, opcode) included

Inst Make(uint32_t opcode, std::initializer_list<uint32_t> operands);
inline uint32_t Opcode(const Inst& inst) { return inst[0] & 0xffff; }
void Append(Inst& inst, std::initializer_list<uint32_t> operands);
// A literal string as SPIR-V words (NUL-terminated, zero-padded).
std::vector<uint32_t> Literal(absl::string_view s);
// Where an OpEntryPoint's interface ids begin (after its NUL-terminated name).
size_t InterfaceStart(const Inst& entry_point);
// The literal string of an instruction's `words` that begins at word `from`: its bytes up to the
// first NUL (or the words' end), whatever the padding after the NUL holds, as the validator
// reads it.
std::string LiteralString(absl::Span<const uint32_t> words, size_t from);

struct Block {
  uint32_t label = 0;
  std::vector<Inst> body;  // after the OpLabel; the terminator last
};

struct Function {
  std::vector<Inst> head;  // OpFunction and its parameters
  std::vector<Block> blocks;
  Inst end;
  uint32_t id() const { return head[0].size() >= 3 ? head[0][2] : 0; }
};

struct EditableModule {
  uint32_t header[5] = {};
  uint32_t bound = 0;
  std::vector<Inst> globals;  // everything before the first function
  std::vector<Function> functions;

  // INVALID_ARGUMENT for words that are not a sequence of whole instructions, or blocks without
  // a terminator.
  absl::Status Parse(absl::Span<const uint32_t> spirv);
  std::vector<uint32_t> Serialize() const;
  uint32_t NewId() { return bound++; }
  uint32_t version() const { return header[1]; }
};

}  // namespace komputed::core::spirv
