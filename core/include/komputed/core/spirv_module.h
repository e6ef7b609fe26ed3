#pragma once
// One reading of a SPIR-V module: what komputed checks of a shader before the driver sees it
// (capabilities, entry points, descriptor bindings, push-constant block, shared memory, local
// size). The module is read once; sizes that depend on specialization constants are worked out
// on request, for the constants given then.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace komputed::core {

// What a descriptor-bound variable is, in Vulkan's descriptor types.
enum class DescriptorKind : uint8_t {
  kStorageBuffer,  // StorageBuffer storage class, or Uniform with a BufferBlock struct
  kUniformBuffer,  // Uniform with a Block struct
  kImage,          // OpTypeImage (storage, sampled or texel buffer)
  kSampler,
  kSampledImage,
  kAccelerationStructure,
  kOther,  // anything else in a descriptor storage class
};
absl::string_view DescriptorKindName(DescriptorKind kind);

// A module-scope variable that a descriptor would back.
struct SpirvBinding {
  uint32_t variable = 0;  // its result id
  std::string name;       // from OpName, may be empty
  uint32_t set = 0;       // DescriptorSet decoration (0 when absent)
  uint32_t binding = 0;   // Binding decoration (0 when absent)
  uint32_t storage_class = 0;
  DescriptorKind kind = DescriptorKind::kOther;
  // Descriptors at the binding: 1, more for an array of them, 0 for a runtime array of them.
  uint64_t descriptor_count = 1;
  bool runtime_array = false;  // the block's last member is a runtime array
  bool used = false;           // a function refers to it (a superset of static use)
  // kImage: its OpTypeImage's operands (spv::Dim, Arrayed, MS, Sampled, spv::ImageFormat), and
  // its sampled type's kind.
  struct ImageType {
    uint32_t dim = 0;
    uint32_t arrayed = 0;
    uint32_t multisampled = 0;
    uint32_t sampled = 0;  // 1: sampled, 2: storage
    uint32_t format = 0;   // spv::ImageFormat; 0 is Unknown
    enum class Component : uint8_t {
      kFloat,
      kSigned,
      kUnsigned,
      kOther
    } component = Component::kOther;
  } image;
};

// An OpEntryPoint.
struct SpirvEntryPoint {
  uint32_t execution_model = 0;  // spv::ExecutionModel
  uint32_t function = 0;         // the entry function's id
  std::string name;
};

// Specialization constant values as an algorithm gives them: constant `SpecId` k is at byte
// offset k * constant_size of `data`. Ids beyond the data keep the module's defaults.
struct SpecConstants {
  absl::Span<const uint8_t> data;
  uint32_t constant_size = 4;
};

// A parsed module. Immutable after Parse; safe to share between threads.
class SpirvModule {
 public:
  // A value the module's constants do not determine (an unsupported OpSpecConstantOp, say).
  static constexpr uint64_t kUnknown = UINT64_MAX;

  // Reads a module (its 5-word header, then instructions). Never reads outside `words` and takes
  // time and memory linear in their number: a malformed module gives a partial reading, for
  // ValidateSpirv to reject.
  static SpirvModule Parse(absl::Span<const uint32_t> words);

  SpirvModule(SpirvModule&&) = default;
  SpirvModule& operator=(SpirvModule&&) = default;
  ~SpirvModule();

  uint32_t version() const { return version_; }  // the header's version word
  const std::vector<uint32_t>& capabilities() const { return capabilities_; }
  const std::vector<std::string>& extensions() const { return extensions_; }
  const std::vector<std::string>& ext_inst_imports() const { return ext_inst_imports_; }
  uint32_t addressing_model() const { return addressing_model_; }
  uint32_t memory_model() const { return memory_model_; }
  const std::vector<SpirvEntryPoint>& entry_points() const { return entry_points_; }
  // The GLCompute entry point named "main" (the one a pipeline runs), or null.
  const SpirvEntryPoint* ComputeMain() const;
  // Module-scope variables in the descriptor storage classes (UniformConstant, Uniform,
  // StorageBuffer), and any other variable decorated with a DescriptorSet or a Binding.
  const std::vector<SpirvBinding>& bindings() const { return bindings_; }
  // A pointer type in the PhysicalStorageBuffer storage class (buffer device address), or the
  // PhysicalStorageBuffer64 addressing model.
  bool uses_physical_storage_buffer() const { return physical_storage_buffer_; }
  bool has_push_constants() const { return !push_constant_types_.empty(); }

  // The local size (invocations per workgroup) of main: its WorkgroupSize built-in when it has
  // one, else its LocalSizeId or LocalSize execution mode, else {1, 1, 1}. kUnknown components
  // count as UINT32_MAX (a bound errs on the safe side).
  std::array<uint64_t, 3> LocalSize(const SpecConstants& spec) const;
  // The bytes the push-constant block spans: the end of its last byte (offsets and member sizes,
  // arrays by ArrayStride, matrices by MatrixStride, nested structs); 0 without one.
  uint64_t PushConstantBytes(const SpecConstants& spec) const;
  // The bytes of the module's Workgroup (shared) variables, at their natural sizes.
  uint64_t SharedMemoryBytes(const SpecConstants& spec) const;

  // The value of an integer constant (kUnknown when it is not one the module determines).
  uint64_t ConstantValue(uint32_t id, const SpecConstants& spec) const;

 private:
  struct Instruction {
    uint32_t opcode = 0;
    std::vector<uint32_t> operands;  // the words after the result id
  };
  struct MemberLayout {
    std::optional<uint32_t> offset;
    uint32_t matrix_stride = 0;
    bool row_major = false;
  };
  class Sizer;

  SpirvModule() = default;

  uint32_t version_ = 0;
  std::vector<uint32_t> capabilities_;
  std::vector<std::string> extensions_;
  std::vector<std::string> ext_inst_imports_;
  uint32_t addressing_model_ = 0;
  uint32_t memory_model_ = 0;
  std::vector<SpirvEntryPoint> entry_points_;
  std::vector<SpirvBinding> bindings_;
  bool physical_storage_buffer_ = false;

  // Types and constants by result id.
  absl::flat_hash_map<uint32_t, Instruction> types_;
  absl::flat_hash_map<uint32_t, Instruction> constants_;
  absl::flat_hash_map<uint32_t, uint32_t> spec_ids_;
  absl::flat_hash_map<uint32_t, uint32_t> array_strides_;
  absl::flat_hash_map<uint64_t, MemberLayout> member_layouts_;  // by struct << 32 | member
  // The execution modes of main.
  std::optional<std::array<uint32_t, 3>> local_size_;
  std::optional<std::array<uint32_t, 3>> local_size_ids_;
  uint32_t workgroup_size_id_ = 0;             // the WorkgroupSize built-in's constant
  std::vector<uint32_t> push_constant_types_;  // pointee types of PushConstant variables
  std::vector<uint32_t> workgroup_types_;      // pointee types of Workgroup variables
};

}  // namespace komputed::core
