#include "komputed/core/spirv_module.h"

#include <algorithm>
#include <cstring>
#include <spirv/unified1/spirv.hpp11>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "spirv_edit.h"

namespace komputed::core {
namespace {

constexpr uint32_t kMagic = 0x07230203u;
constexpr size_t kHeaderWords = 5;
// Deeper nesting of types or constant expressions than this counts as unknown: valid modules
// need far less, and the bound keeps the recursion's stack small.
constexpr int kMaxDepth = 128;

constexpr uint32_t Op(spv::Op op) { return static_cast<uint32_t>(op); }
constexpr uint32_t Sc(spv::StorageClass c) { return static_cast<uint32_t>(c); }
constexpr uint32_t Dec(spv::Decoration d) { return static_cast<uint32_t>(d); }

uint64_t SatAdd(uint64_t a, uint64_t b) {
  return a > SpirvModule::kUnknown - b ? SpirvModule::kUnknown : a + b;
}
uint64_t SatMul(uint64_t a, uint64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > SpirvModule::kUnknown / b ? SpirvModule::kUnknown : a * b;
}

// Calls f(opcode, words, word_count) for each instruction after the header; stops at the first
// one that is empty or runs past the end.
template <typename F>
void ForEachInstruction(absl::Span<const uint32_t> spirv, F&& f) {
  for (size_t at = kHeaderWords; at < spirv.size();) {
    const uint32_t count = spirv[at] >> 16, opcode = spirv[at] & 0xffff;
    if (count == 0 || count > spirv.size() - at) break;
    f(opcode, &spirv[at], static_cast<size_t>(count));
    at += count;
  }
}

bool IsTypeDeclaration(uint32_t opcode) {
  return (opcode >= Op(spv::Op::OpTypeVoid) && opcode <= Op(spv::Op::OpTypePipe)) ||
         opcode == Op(spv::Op::OpTypeAccelerationStructureKHR) ||
         opcode == Op(spv::Op::OpTypeRayQueryKHR);
}

bool IsConstantDeclaration(uint32_t opcode) {
  return (opcode >= Op(spv::Op::OpConstantTrue) && opcode <= Op(spv::Op::OpConstantNull)) ||
         (opcode >= Op(spv::Op::OpSpecConstantTrue) && opcode <= Op(spv::Op::OpSpecConstantOp));
}

}  // namespace

absl::string_view DescriptorKindName(DescriptorKind kind) {
  switch (kind) {
    case DescriptorKind::kStorageBuffer:
      return "storage buffer";
    case DescriptorKind::kUniformBuffer:
      return "uniform buffer";
    case DescriptorKind::kImage:
      return "image";
    case DescriptorKind::kSampler:
      return "sampler";
    case DescriptorKind::kSampledImage:
      return "sampled image";
    case DescriptorKind::kAccelerationStructure:
      return "acceleration structure";
    case DescriptorKind::kOther:
      break;
  }
  return "resource of another kind";
}

// Works out constants and type sizes for one set of specialization constants, each id once.
class SpirvModule::Sizer {
 public:
  Sizer(const SpirvModule& m, const SpecConstants& spec) : m_(m), spec_(spec) {}

  uint64_t Constant(uint32_t id, int depth = 0) {
    if (auto it = constants_.find(id); it != constants_.end()) return it->second;
    const uint64_t v = depth > kMaxDepth ? kUnknown : ComputeConstant(id, depth);
    constants_[id] = v;
    return v;
  }

  // The bytes a value of `type` spans: explicit layouts (Offset, ArrayStride) where the module
  // gives them, natural sizes elsewhere.
  uint64_t Size(uint32_t type, int depth = 0) {
    if (auto it = sizes_.find(type); it != sizes_.end()) return it->second;
    const uint64_t v = depth > kMaxDepth ? kUnknown : ComputeSize(type, depth);
    sizes_[type] = v;
    return v;
  }

 private:
  const Instruction* Type(uint32_t id) const {
    auto it = m_.types_.find(id);
    return it == m_.types_.end() ? nullptr : &it->second;
  }

  uint32_t Width(uint32_t type) const {
    const Instruction* t = Type(type);
    if (t == nullptr || t->operands.empty()) return 32;
    if (t->opcode == Op(spv::Op::OpTypeInt) || t->opcode == Op(spv::Op::OpTypeFloat)) {
      return t->operands[0];
    }
    return 32;
  }

  uint64_t ComputeConstant(uint32_t id, int depth) {
    auto it = m_.constants_.find(id);
    if (it == m_.constants_.end()) return kUnknown;
    const Instruction& c = it->second;  // operands: the result type, then the rest
    const std::vector<uint32_t>& o = c.operands;
    const uint32_t width = o.empty() ? 32 : Width(o[0]);
    const uint64_t mask = width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
    switch (static_cast<spv::Op>(c.opcode)) {
      case spv::Op::OpConstantTrue:
        return 1;
      case spv::Op::OpConstantFalse:
      case spv::Op::OpConstantNull:
        return 0;
      case spv::Op::OpSpecConstantTrue:
      case spv::Op::OpSpecConstantFalse: {
        if (std::optional<uint64_t> v = Specialized(id, 4); v.has_value()) return *v != 0;
        return c.opcode == Op(spv::Op::OpSpecConstantTrue) ? 1 : 0;
      }
      case spv::Op::OpConstant:
      case spv::Op::OpSpecConstant: {
        if (c.opcode == Op(spv::Op::OpSpecConstant)) {
          if (std::optional<uint64_t> v = Specialized(id, width > 32 ? 8 : 4); v.has_value()) {
            return *v & mask;
          }
        }
        if (o.size() < 2) return kUnknown;
        uint64_t v = o[1];
        if (o.size() >= 3 && width > 32) v |= static_cast<uint64_t>(o[2]) << 32;
        return v & mask;
      }
      case spv::Op::OpSpecConstantOp:
        return o.size() < 2 ? kUnknown : Evaluate(o, width, mask, depth);
      default:
        return kUnknown;  // composites have no single value
    }
  }

  // A specialization constant's value from the algorithm's data, when it gives one.
  std::optional<uint64_t> Specialized(uint32_t id, uint32_t bytes) const {
    auto spec_id = m_.spec_ids_.find(id);
    if (spec_id == m_.spec_ids_.end() || spec_.constant_size < 4) return std::nullopt;
    const uint64_t offset = static_cast<uint64_t>(spec_id->second) * spec_.constant_size;
    const uint32_t n = std::min(bytes, spec_.constant_size >= 8 ? 8u : 4u);
    if (offset + n > spec_.data.size()) return std::nullopt;
    uint64_t v = 0;
    std::memcpy(&v, spec_.data.data() + offset, n);
    return v;
  }

  // OpSpecConstantOp over integers: operands are [type, opcode, a, b, c].
  uint64_t Evaluate(const std::vector<uint32_t>& o, uint32_t width, uint64_t mask, int depth) {
    const auto op = static_cast<spv::Op>(o[1]);
    auto arg = [&](size_t i) {
      return i + 2 < o.size() ? Constant(o[i + 2], depth + 1) : kUnknown;
    };
    auto signed_of = [&](uint64_t v) -> int64_t {
      if (width >= 64) return static_cast<int64_t>(v);
      const uint64_t sign = uint64_t{1} << (width - 1);
      return static_cast<int64_t>((v ^ sign) - sign);
    };
    const uint64_t a = arg(0);
    if (a == kUnknown) return kUnknown;
    if (op == spv::Op::OpUConvert || op == spv::Op::OpSConvert) return a & mask;
    if (op == spv::Op::OpSNegate) return static_cast<uint64_t>(-signed_of(a)) & mask;
    if (op == spv::Op::OpNot) return ~a & mask;
    const uint64_t b = arg(1);
    if (b == kUnknown) return kUnknown;
    switch (op) {
      case spv::Op::OpIAdd:
        return (a + b) & mask;
      case spv::Op::OpISub:
        return (a - b) & mask;
      case spv::Op::OpIMul:
        return (a * b) & mask;
      case spv::Op::OpUDiv:
        return b == 0 ? kUnknown : (a / b) & mask;
      case spv::Op::OpUMod:
        return b == 0 ? kUnknown : (a % b) & mask;
      case spv::Op::OpSDiv:
        return signed_of(b) == 0 || signed_of(b) == -1
                   ? kUnknown
                   : static_cast<uint64_t>(signed_of(a) / signed_of(b)) & mask;
      case spv::Op::OpShiftLeftLogical:
        return b >= width ? kUnknown : (a << b) & mask;
      case spv::Op::OpShiftRightLogical:
        return b >= width ? kUnknown : (a >> b) & mask;
      case spv::Op::OpBitwiseOr:
        return (a | b) & mask;
      case spv::Op::OpBitwiseAnd:
        return (a & b) & mask;
      case spv::Op::OpBitwiseXor:
        return (a ^ b) & mask;
      case spv::Op::OpSelect: {
        const uint64_t c = arg(2);
        return c == kUnknown ? kUnknown : (a != 0 ? b : c);
      }
      default:
        return kUnknown;
    }
  }

  uint64_t ComputeSize(uint32_t id, int depth) {
    const Instruction* t = Type(id);
    if (t == nullptr) return kUnknown;
    const std::vector<uint32_t>& o = t->operands;
    switch (static_cast<spv::Op>(t->opcode)) {
      case spv::Op::OpTypeBool:
        return 4;
      case spv::Op::OpTypeInt:
      case spv::Op::OpTypeFloat:
        return o.empty() ? kUnknown : (o[0] + 7) / 8;
      case spv::Op::OpTypeVector:
      case spv::Op::OpTypeMatrix:
        return o.size() < 2 ? kUnknown : SatMul(o[1], Size(o[0], depth + 1));
      case spv::Op::OpTypeArray: {
        if (o.size() < 2) return kUnknown;
        const uint64_t length = Constant(o[1]);
        const uint64_t element = Size(o[0], depth + 1);
        if (length == kUnknown || element == kUnknown) return kUnknown;
        if (auto stride = m_.array_strides_.find(id); stride != m_.array_strides_.end()) {
          return length == 0 ? 0 : SatAdd(SatMul(length - 1, stride->second), element);
        }
        return SatMul(length, element);
      }
      case spv::Op::OpTypeRuntimeArray:
        return 0;
      case spv::Op::OpTypeStruct: {
        uint64_t end = 0;
        for (uint32_t i = 0; i < o.size(); ++i) {
          const MemberLayout* layout = nullptr;
          if (auto it = m_.member_layouts_.find((uint64_t{id} << 32) | i);
              it != m_.member_layouts_.end()) {
            layout = &it->second;
          }
          const uint64_t size = MemberSize(o[i], layout, depth + 1);
          const uint64_t start =
              layout != nullptr && layout->offset.has_value() ? uint64_t{*layout->offset} : end;
          end = std::max(end, SatAdd(start, size));
        }
        return end;
      }
      case spv::Op::OpTypePointer:
        return 8;  // a PhysicalStorageBuffer pointer in a block
      default:
        return 0;
    }
  }

  // A struct member's size: a matrix (or an array of them) by its MatrixStride, else Size.
  uint64_t MemberSize(uint32_t type, const MemberLayout* layout, int depth) {
    if (layout == nullptr || layout->matrix_stride == 0) return Size(type, depth);
    const Instruction* t = Type(type);
    if (t == nullptr || depth > kMaxDepth) return kUnknown;
    if (t->opcode == Op(spv::Op::OpTypeArray) && t->operands.size() >= 2) {
      const uint64_t length = Constant(t->operands[1]);
      const uint64_t element = MemberSize(t->operands[0], layout, depth + 1);
      auto stride = m_.array_strides_.find(type);
      if (length == kUnknown || element == kUnknown) return kUnknown;
      if (length == 0) return 0;
      return stride == m_.array_strides_.end()
                 ? SatMul(length, element)
                 : SatAdd(SatMul(length - 1, stride->second), element);
    }
    if (t->opcode != Op(spv::Op::OpTypeMatrix) || t->operands.size() < 2) {
      return Size(type, depth);
    }
    const Instruction* column = Type(t->operands[0]);
    if (column == nullptr || column->operands.size() < 2) return kUnknown;
    const uint64_t columns = t->operands[1], rows = column->operands[1];
    const uint64_t component = Size(column->operands[0], depth + 1);
    if (columns == 0 || rows == 0 || component == kUnknown) return kUnknown;
    // Column-major: a column per stride; row-major: a row per stride.
    const uint64_t strides = layout->row_major ? rows : columns;
    const uint64_t last = layout->row_major ? columns : rows;
    return SatAdd(SatMul(strides - 1, layout->matrix_stride), SatMul(last, component));
  }

  const SpirvModule& m_;
  const SpecConstants& spec_;
  absl::flat_hash_map<uint32_t, uint64_t> constants_;
  absl::flat_hash_map<uint32_t, uint64_t> sizes_;
};

SpirvModule::~SpirvModule() = default;

SpirvModule SpirvModule::Parse(absl::Span<const uint32_t> spirv) {
  SpirvModule m;
  if (spirv.size() < kHeaderWords) return m;
  if (spirv[0] == kMagic) m.version_ = spirv[1];

  struct Mode {
    uint32_t target;
    uint32_t mode;
    std::array<uint32_t, 3> operands;
  };
  struct Variable {
    uint32_t id;
    uint32_t pointer_type;
    uint32_t storage_class;
  };
  std::vector<Mode> modes;
  std::vector<Variable> variables;
  absl::flat_hash_map<uint32_t, std::string> names;
  absl::flat_hash_map<uint32_t, uint32_t> sets, bindings;
  absl::flat_hash_set<uint32_t> buffer_blocks;
  bool in_function = false;

  ForEachInstruction(spirv, [&](uint32_t opcode, const uint32_t* w, size_t n) {
    switch (static_cast<spv::Op>(opcode)) {
      case spv::Op::OpCapability:
        if (n >= 2) m.capabilities_.push_back(w[1]);
        return;
      case spv::Op::OpExtension:
        m.extensions_.push_back(spirv::LiteralString(absl::MakeConstSpan(w, n), 1));
        return;
      case spv::Op::OpExtInstImport:
        if (n >= 3)
          m.ext_inst_imports_.push_back(spirv::LiteralString(absl::MakeConstSpan(w, n), 2));
        return;
      case spv::Op::OpMemoryModel:
        if (n >= 3) {
          m.addressing_model_ = w[1];
          m.memory_model_ = w[2];
        }
        if (n >= 2 &&
            w[1] == static_cast<uint32_t>(spv::AddressingModel::PhysicalStorageBuffer64)) {
          m.physical_storage_buffer_ = true;
        }
        return;
      case spv::Op::OpEntryPoint:
        if (n >= 4)
          m.entry_points_.push_back(
              {w[1], w[2], spirv::LiteralString(absl::MakeConstSpan(w, n), 3)});
        return;
      case spv::Op::OpExecutionMode:
      case spv::Op::OpExecutionModeId:
        if (n >= 6) modes.push_back({w[1], w[2], {w[3], w[4], w[5]}});
        return;
      case spv::Op::OpName:
        if (n >= 3) names[w[1]] = spirv::LiteralString(absl::MakeConstSpan(w, n), 2);
        return;
      case spv::Op::OpDecorate: {
        if (n < 3) return;
        const uint32_t target = w[1], decoration = w[2];
        if (decoration == Dec(spv::Decoration::BufferBlock)) buffer_blocks.insert(target);
        if (n < 4) return;
        if (decoration == Dec(spv::Decoration::SpecId)) m.spec_ids_[target] = w[3];
        if (decoration == Dec(spv::Decoration::ArrayStride)) m.array_strides_[target] = w[3];
        if (decoration == Dec(spv::Decoration::DescriptorSet)) sets[target] = w[3];
        if (decoration == Dec(spv::Decoration::Binding)) bindings[target] = w[3];
        if (decoration == Dec(spv::Decoration::BuiltIn) &&
            w[3] == static_cast<uint32_t>(spv::BuiltIn::WorkgroupSize)) {
          m.workgroup_size_id_ = target;
        }
        return;
      }
      case spv::Op::OpMemberDecorate: {
        if (n < 4) return;
        MemberLayout& layout = m.member_layouts_[(uint64_t{w[1]} << 32) | w[2]];
        const uint32_t decoration = w[3];
        if (decoration == Dec(spv::Decoration::Offset) && n >= 5) layout.offset = w[4];
        if (decoration == Dec(spv::Decoration::MatrixStride) && n >= 5) {
          layout.matrix_stride = w[4];
        }
        if (decoration == Dec(spv::Decoration::RowMajor)) layout.row_major = true;
        if (decoration == Dec(spv::Decoration::ColMajor)) layout.row_major = false;
        return;
      }
      case spv::Op::OpTypeForwardPointer:
        if (n >= 3 && w[2] == Sc(spv::StorageClass::PhysicalStorageBuffer)) {
          m.physical_storage_buffer_ = true;
        }
        return;
      case spv::Op::OpVariable:
        if (!in_function && n >= 4) variables.push_back({w[2], w[1], w[3]});
        return;
      case spv::Op::OpFunction:
        in_function = true;
        return;
      case spv::Op::OpFunctionEnd:
        in_function = false;
        return;
      default:
        break;
    }
    if (IsTypeDeclaration(opcode) && n >= 2) {
      m.types_[w[1]] = {opcode, std::vector<uint32_t>(w + 2, w + n)};
      if (opcode == Op(spv::Op::OpTypePointer) && n >= 3 &&
          w[2] == Sc(spv::StorageClass::PhysicalStorageBuffer)) {
        m.physical_storage_buffer_ = true;
      }
    } else if (IsConstantDeclaration(opcode) && n >= 3) {
      // The result type first, then the operands after the result id.
      std::vector<uint32_t> operands = {w[1]};
      operands.insert(operands.end(), w + 3, w + n);
      m.constants_[w[2]] = {opcode, std::move(operands)};
    }
  });

  // Main's execution modes.
  if (const SpirvEntryPoint* main = m.ComputeMain(); main != nullptr) {
    for (const Mode& mode : modes) {
      if (mode.target != main->function) continue;
      if (mode.mode == static_cast<uint32_t>(spv::ExecutionMode::LocalSize)) {
        m.local_size_ = mode.operands;
      } else if (mode.mode == static_cast<uint32_t>(spv::ExecutionMode::LocalSizeId)) {
        m.local_size_ids_ = mode.operands;
      }
    }
  }

  // Variables: descriptors, push constants, shared memory.
  const SpecConstants defaults;
  Sizer sizer(m, defaults);
  absl::flat_hash_map<uint32_t, size_t> binding_of;  // variable id → index in bindings_
  for (const Variable& v : variables) {
    auto pointer = m.types_.find(v.pointer_type);
    if (pointer == m.types_.end() || pointer->second.operands.size() < 2) continue;
    uint32_t type = pointer->second.operands[1];
    if (v.storage_class == Sc(spv::StorageClass::PushConstant)) {
      m.push_constant_types_.push_back(type);
      continue;
    }
    if (v.storage_class == Sc(spv::StorageClass::Workgroup)) {
      m.workgroup_types_.push_back(type);
      continue;
    }
    const bool descriptor_class = v.storage_class == Sc(spv::StorageClass::UniformConstant) ||
                                  v.storage_class == Sc(spv::StorageClass::Uniform) ||
                                  v.storage_class == Sc(spv::StorageClass::StorageBuffer);
    if (!descriptor_class && !sets.contains(v.id) && !bindings.contains(v.id)) continue;
    SpirvBinding b;
    b.variable = v.id;
    if (auto name = names.find(v.id); name != names.end()) b.name = name->second;
    if (auto set = sets.find(v.id); set != sets.end()) b.set = set->second;
    if (auto binding = bindings.find(v.id); binding != bindings.end()) b.binding = binding->second;
    b.storage_class = v.storage_class;
    auto t = m.types_.find(type);
    if (t != m.types_.end() && !t->second.operands.empty()) {
      if (t->second.opcode == Op(spv::Op::OpTypeArray) && t->second.operands.size() >= 2) {
        b.descriptor_count = sizer.Constant(t->second.operands[1]);
        type = t->second.operands[0];
      } else if (t->second.opcode == Op(spv::Op::OpTypeRuntimeArray)) {
        b.descriptor_count = 0;
        type = t->second.operands[0];
      }
      t = m.types_.find(type);
    }
    const uint32_t type_op = t == m.types_.end() ? 0 : t->second.opcode;
    if (v.storage_class == Sc(spv::StorageClass::StorageBuffer)) {
      b.kind = DescriptorKind::kStorageBuffer;
    } else if (v.storage_class == Sc(spv::StorageClass::Uniform)) {
      b.kind = buffer_blocks.contains(type) ? DescriptorKind::kStorageBuffer
                                            : DescriptorKind::kUniformBuffer;
    } else if (type_op == Op(spv::Op::OpTypeImage)) {
      b.kind = DescriptorKind::kImage;
      const std::vector<uint32_t>& o = t->second.operands;
      if (o.size() >= 7) {
        b.image.dim = o[1];
        b.image.arrayed = o[3];
        b.image.multisampled = o[4];
        b.image.sampled = o[5];
        b.image.format = o[6];
        auto component = m.types_.find(o[0]);
        if (component != m.types_.end()) {
          const Instruction& c = component->second;
          using Component = SpirvBinding::ImageType::Component;
          if (c.opcode == Op(spv::Op::OpTypeFloat)) {
            b.image.component = Component::kFloat;
          } else if (c.opcode == Op(spv::Op::OpTypeInt) && c.operands.size() >= 2) {
            b.image.component = c.operands[1] != 0 ? Component::kSigned : Component::kUnsigned;
          }
        }
      }
    } else if (type_op == Op(spv::Op::OpTypeSampler)) {
      b.kind = DescriptorKind::kSampler;
    } else if (type_op == Op(spv::Op::OpTypeSampledImage)) {
      b.kind = DescriptorKind::kSampledImage;
    } else if (type_op == Op(spv::Op::OpTypeAccelerationStructureKHR)) {
      b.kind = DescriptorKind::kAccelerationStructure;
    }
    if (type_op == Op(spv::Op::OpTypeStruct) && !t->second.operands.empty()) {
      auto last = m.types_.find(t->second.operands.back());
      b.runtime_array =
          last != m.types_.end() && last->second.opcode == Op(spv::Op::OpTypeRuntimeArray);
    }
    binding_of[v.id] = m.bindings_.size();
    m.bindings_.push_back(std::move(b));
  }

  // Which of them a function refers to: any word after an instruction's opcode that is the
  // variable's id (a literal that happens to equal it only errs towards "used").
  if (!binding_of.empty()) {
    in_function = false;
    ForEachInstruction(spirv, [&](uint32_t opcode, const uint32_t* w, size_t n) {
      if (opcode == Op(spv::Op::OpFunction)) in_function = true;
      if (opcode == Op(spv::Op::OpFunctionEnd)) in_function = false;
      if (!in_function) return;
      for (size_t i = 1; i < n; ++i) {
        if (auto it = binding_of.find(w[i]); it != binding_of.end()) {
          m.bindings_[it->second].used = true;
        }
      }
    });
  }
  return m;
}

const SpirvEntryPoint* SpirvModule::ComputeMain() const {
  for (const SpirvEntryPoint& e : entry_points_) {
    if (e.execution_model == static_cast<uint32_t>(spv::ExecutionModel::GLCompute) &&
        e.name == "main") {
      return &e;
    }
  }
  return nullptr;
}

uint64_t SpirvModule::ConstantValue(uint32_t id, const SpecConstants& spec) const {
  return Sizer(*this, spec).Constant(id);
}

std::array<uint64_t, 3> SpirvModule::LocalSize(const SpecConstants& spec) const {
  Sizer sizer(*this, spec);
  auto bounded = [&](uint32_t id) {
    const uint64_t v = sizer.Constant(id);
    return v == kUnknown ? uint64_t{UINT32_MAX} : v;
  };
  if (workgroup_size_id_ != 0) {
    auto c = constants_.find(workgroup_size_id_);
    // A composite's operands: its type, then its three constituents.
    if (c != constants_.end() && c->second.operands.size() >= 4 &&
        (c->second.opcode == Op(spv::Op::OpConstantComposite) ||
         c->second.opcode == Op(spv::Op::OpSpecConstantComposite))) {
      const std::vector<uint32_t>& o = c->second.operands;
      return {bounded(o[1]), bounded(o[2]), bounded(o[3])};
    }
  }
  if (local_size_ids_.has_value()) {
    const auto& ids = *local_size_ids_;
    return {bounded(ids[0]), bounded(ids[1]), bounded(ids[2])};
  }
  if (local_size_.has_value()) {
    const auto& s = *local_size_;
    return {s[0], s[1], s[2]};
  }
  return {1, 1, 1};
}

uint64_t SpirvModule::PushConstantBytes(const SpecConstants& spec) const {
  Sizer sizer(*this, spec);
  uint64_t bytes = 0;
  for (uint32_t type : push_constant_types_) bytes = std::max(bytes, sizer.Size(type));
  return bytes;
}

uint64_t SpirvModule::SharedMemoryBytes(const SpecConstants& spec) const {
  Sizer sizer(*this, spec);
  uint64_t bytes = 0;
  for (uint32_t type : workgroup_types_) bytes = SatAdd(bytes, sizer.Size(type));
  return bytes;
}

}  // namespace komputed::core
