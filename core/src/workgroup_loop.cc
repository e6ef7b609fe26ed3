// LoopOverWorkgroups (workgroup_loop.h): a SPIR-V rewrite that runs a dispatch's workgroups in a
// loop over fewer real ones.
#include "komputed/core/workgroup_loop.h"

#include <array>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "komputed/core/status.h"
#include "spirv_edit.h"

namespace komputed::core {
namespace {

using namespace spirv;  // NOLINT(build/namespaces): the rewrite speaks SPIR-V throughout

// A built-in input that the loop replaces by a Private variable it sets.
struct Replaced {
  uint32_t input = 0;    // the module's Input variable
  uint32_t pointee = 0;  // its type: a 3-component vector of 32-bit integers
  uint32_t component = 0;
  bool is_signed = false;
  uint32_t variable = 0;  // the Private variable that takes its place
};

class Looper {
 public:
  Looper(EditableModule& m, const WorkgroupLoop& loop) : m_(m), loop_(loop) {}
  absl::Status Run();
  uint32_t main() const { return entry_; }
  uint32_t body() const { return body_; }

 private:
  uint32_t Constant(uint32_t value);
  uint32_t PointerType(uint32_t storage, uint32_t pointee);
  // A 3-component vector input's value as three 32-bit unsigned ids.
  std::array<uint32_t, 3> LoadUnsigned(std::vector<Inst>& out, uint32_t input, uint32_t vector,
                                       uint32_t component, bool is_signed);
  // Stores three 32-bit unsigned ids into `r`'s Private variable, as its type has them.
  void StoreVector(std::vector<Inst>& out, const Replaced& r, const std::array<uint32_t, 3>& c);
  absl::Status Retarget(Replaced& r);
  absl::StatusOr<std::array<uint32_t, 3>> LocalSize(std::vector<Inst>& out);

  EditableModule& m_;
  const WorkgroupLoop& loop_;
  std::vector<Inst> added_;        // new types, constants and variables, after the module's
  std::vector<Inst> decorations_;  // new decorations
  uint32_t uint_ = 0, bool_ = 0, uvec3_ = 0, entry_ = 0, body_ = 0;
  absl::flat_hash_map<uint32_t, uint32_t> constants_;  // value → id
  absl::flat_hash_map<uint64_t, uint32_t> pointers_;   // storage << 32 | pointee → id
  absl::flat_hash_map<uint32_t, const Inst*> defs_;    // types, constants, variables by result id
  absl::flat_hash_map<uint32_t, uint32_t> builtins_;   // built-in → decorated id
  std::array<uint32_t, 3> local_size_ = {1, 1, 1};
  std::array<uint32_t, 3> local_size_ids_ = {0, 0, 0};
  bool local_size_by_id_ = false;
};

uint32_t Looper::Constant(uint32_t value) {
  auto [it, inserted] = constants_.try_emplace(value, 0);
  if (inserted) {
    it->second = m_.NewId();
    added_.push_back(Make(kOpConstant, {uint_, it->second, value}));
  }
  return it->second;
}

uint32_t Looper::PointerType(uint32_t storage, uint32_t pointee) {
  auto [it, inserted] = pointers_.try_emplace(uint64_t{storage} << 32 | pointee, 0);
  if (inserted) {
    it->second = m_.NewId();
    added_.push_back(Make(kOpTypePointer, {it->second, storage, pointee}));
  }
  return it->second;
}

std::array<uint32_t, 3> Looper::LoadUnsigned(std::vector<Inst>& out, uint32_t input,
                                             uint32_t vector, uint32_t component, bool is_signed) {
  const uint32_t value = m_.NewId();
  out.push_back(Make(kOpLoad, {vector, value, input}));
  std::array<uint32_t, 3> c{};
  for (uint32_t d = 0; d < 3; ++d) {
    c[d] = m_.NewId();
    out.push_back(Make(kOpCompositeExtract, {component, c[d], value, d}));
    if (is_signed) {
      const uint32_t u = m_.NewId();
      out.push_back(Make(kOpBitcast, {uint_, u, c[d]}));
      c[d] = u;
    }
  }
  return c;
}

void Looper::StoreVector(std::vector<Inst>& out, const Replaced& r,
                         const std::array<uint32_t, 3>& c) {
  std::array<uint32_t, 3> typed = c;
  if (r.is_signed) {
    for (uint32_t d = 0; d < 3; ++d) {
      typed[d] = m_.NewId();
      out.push_back(Make(kOpBitcast, {r.component, typed[d], c[d]}));
    }
  }
  const uint32_t value = m_.NewId();
  out.push_back(Make(kOpCompositeConstruct, {r.pointee, value, typed[0], typed[1], typed[2]}));
  out.push_back(Make(kOpStore, {r.variable, value}));
}

// Points every use of `r.input` in the functions at its Private variable, giving the pointers
// derived from it (access chains, copies) Private pointer types.
absl::Status Looper::Retarget(Replaced& r) {
  r.variable = m_.NewId();
  added_.push_back(
      Make(kOpVariable, {PointerType(kStoragePrivate, r.pointee), r.variable, kStoragePrivate}));
  absl::flat_hash_set<uint32_t> derived = {r.input};
  for (Function& f : m_.functions) {
    for (Block& b : f.blocks) {
      for (Inst& inst : b.body) {
        const uint32_t op = Opcode(inst);
        if (op == kOpLine || op == kOpNoLine) continue;
        const bool from_pointer = (op == kOpLoad || op == kOpAccessChain ||
                                   op == kOpInBoundsAccessChain || op == kOpCopyObject) &&
                                  inst.size() >= 4 && derived.contains(inst[3]);
        if (from_pointer) {
          if (inst[3] == r.input) inst[3] = r.variable;
          if (op != kOpLoad) {
            // The result is a pointer into the input: the same pointer, now Private.
            auto type = defs_.find(inst[1]);
            if (type == defs_.end() || Opcode(*type->second) != kOpTypePointer ||
                type->second->size() < 4) {
              return absl::InvalidArgumentError(
                  absl::StrCat("%", inst[2], " derives from a built-in but is no pointer"));
            }
            inst[1] = PointerType(kStoragePrivate, (*type->second)[3]);
            derived.insert(inst[2]);
          }
          continue;
        }
        for (size_t w = 1; w < inst.size(); ++w) {
          if (derived.contains(inst[w])) {
            return absl::UnimplementedError(absl::StrCat(
                "a built-in workgroup or invocation id is used by an instruction of opcode ", op,
                ", which the workgroup loop does not rewrite"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::array<uint32_t, 3>> Looper::LocalSize(std::vector<Inst>& out) {
  std::array<uint32_t, 3> c{};
  if (auto it = builtins_.find(kBuiltInWorkgroupSize); it != builtins_.end()) {
    // The WorkgroupSize constant (perhaps specialised) takes precedence over the modes.
    auto def = defs_.find(it->second);
    if (def == defs_.end() || def->second->size() < 3) {
      return absl::InvalidArgumentError("the WorkgroupSize built-in is no constant");
    }
    const uint32_t vector = (*def->second)[1];
    auto vec = defs_.find(vector);
    if (vec == defs_.end() || Opcode(*vec->second) != kOpTypeVector || vec->second->size() < 4) {
      return absl::InvalidArgumentError("the WorkgroupSize built-in is no vector");
    }
    auto component = defs_.find((*vec->second)[2]);
    const bool is_signed =
        component != defs_.end() && component->second->size() >= 4 && (*component->second)[3] != 0;
    for (uint32_t d = 0; d < 3; ++d) {
      c[d] = m_.NewId();
      out.push_back(Make(kOpCompositeExtract, {(*vec->second)[2], c[d], it->second, d}));
      if (is_signed) {
        const uint32_t u = m_.NewId();
        out.push_back(Make(kOpBitcast, {uint_, u, c[d]}));
        c[d] = u;
      }
    }
    return c;
  }
  if (local_size_by_id_) {
    for (uint32_t d = 0; d < 3; ++d) {
      auto def = defs_.find(local_size_ids_[d]);
      if (def == defs_.end() || def->second->size() < 3) {
        return absl::InvalidArgumentError("a LocalSizeId operand is no constant");
      }
      c[d] = local_size_ids_[d];
      if ((*def->second)[1] != uint_) {
        c[d] = m_.NewId();
        out.push_back(Make(kOpBitcast, {uint_, c[d], local_size_ids_[d]}));
      }
    }
    return c;
  }
  for (uint32_t d = 0; d < 3; ++d) c[d] = Constant(local_size_[d]);
  return c;
}

absl::Status Looper::Run() {
  const auto [x, y, z] = loop_.workgroups;
  const uint32_t r = loop_.resident;
  if (x == 0 || y == 0 || z == 0 || r == 0) {
    return absl::InvalidArgumentError("a workgroup loop over a zero count");
  }
  if (uint64_t{x} * y * z <= r) {
    return absl::InvalidArgumentError(absl::StrCat("a workgroup loop of ", r,
                                                   " resident workgroups over a dispatch of ",
                                                   uint64_t{x} * y * z));
  }

  // The loop keeps v as (v mod x, v / x) in 32-bit values: v mod x + resident mod x and
  // v / x + resident / x + 1 must not wrap.
  if (x >= (1u << 31) || uint64_t{y} * z + r / x + 1 >= (uint64_t{1} << 32)) {
    return absl::UnimplementedError(
        absl::StrCat("a workgroup loop over a dispatch of ", x, " x ", y, " x ", z, " workgroups"));
  }

  // What the module has.
  size_t entry_points = 0;
  Inst* entry_point = nullptr;
  bool shared_memory = false;
  absl::flat_hash_set<uint32_t> void_types;
  for (Inst& inst : m_.globals) {
    const uint32_t op = Opcode(inst);
    if (op == kOpEntryPoint && inst.size() >= 4) {
      ++entry_points;
      if (inst[1] == kGLCompute && LiteralString(inst, 3) == "main") {
        entry_point = &inst;
        entry_ = inst[2];
      }
    }
    if (op == kOpTypeInt && inst.size() == 4 && inst[2] == 32 && inst[3] == 0) uint_ = inst[1];
    if (op == kOpTypeBool && inst.size() == 2) bool_ = inst[1];
    if (op == kOpTypeVoid && inst.size() == 2) void_types.insert(inst[1]);
    if (op == kOpDecorate && inst.size() >= 4 && inst[2] == kDecorationBuiltIn &&
        !builtins_.emplace(inst[3], inst[1]).second) {
      return absl::UnimplementedError(absl::StrCat("built-in ", inst[3], " decorates two ids"));
    }
    if (op == kOpDecorationGroup) {
      return absl::UnimplementedError("a module with decoration groups");
    }
    if (op == kOpMemberDecorate && inst.size() >= 5 && inst[3] == kDecorationBuiltIn) {
      const uint32_t b = inst[4];
      if (b == kBuiltInWorkgroupId || b == kBuiltInGlobalInvocationId ||
          b == kBuiltInNumWorkgroups || b == kBuiltInLocalInvocationId) {
        return absl::UnimplementedError(
            "a workgroup or invocation id built-in decorates a struct member");
      }
    }
    if (op == kOpVariable && inst.size() >= 4 && inst[3] == kStorageWorkgroup) {
      shared_memory = true;
    }
    if (op == kOpVariable && inst.size() >= 5 &&
        (inst[3] == kStoragePrivate || inst[3] == kStorageWorkgroup)) {
      return absl::UnimplementedError(
          "a Private or Workgroup variable with an initializer (it would be initialized once for "
          "every virtual workgroup of a real one)");
    }
    if (op == kOpTypePointer && inst.size() >= 4) {
      pointers_[uint64_t{inst[2]} << 32 | inst[3]] = inst[1];
    }
    if ((op >= kOpTypeVoid && op <= kOpTypeFunction) || (op >= 41 && op <= 52) ||
        op == kOpVariable) {
      // Types, constants, spec constants: the result id is the first operand for types and the
      // second for the others.
      const bool is_type = op >= kOpTypeVoid && op <= kOpTypeFunction;
      if (inst.size() >= (is_type ? 2u : 3u)) defs_[is_type ? inst[1] : inst[2]] = &inst;
    }
  }
  if (entry_point == nullptr) return absl::InvalidArgumentError("no GLCompute entry point main");
  if (entry_points != 1) {
    return absl::UnimplementedError("a module with more than one entry point");
  }
  for (const Inst& inst : m_.globals) {
    const uint32_t op = Opcode(inst);
    if ((op != kOpExecutionMode && op != kOpExecutionModeId) || inst.size() < 6 ||
        inst[1] != entry_) {
      continue;
    }
    if (inst[2] == kExecutionModeLocalSize) local_size_ = {inst[3], inst[4], inst[5]};
    if (inst[2] == kExecutionModeLocalSizeId) {
      local_size_ids_ = {inst[3], inst[4], inst[5]};
      local_size_by_id_ = true;
    }
  }
  Function* entry = nullptr;
  for (Function& f : m_.functions) {
    if (f.id() == entry_) entry = &f;
  }
  if (entry == nullptr || entry->head.size() != 1 || entry->head[0].size() < 5 ||
      !void_types.contains(entry->head[0][1])) {
    return absl::InvalidArgumentError(
        "the entry point main is no void function without parameters");
  }
  if (uint_ == 0) {
    uint_ = m_.NewId();
    added_.push_back(Make(kOpTypeInt, {uint_, 32, 0}));
  }
  if (bool_ == 0) {
    bool_ = m_.NewId();
    added_.push_back(Make(kOpTypeBool, {bool_}));
  }
  for (const Inst& inst : m_.globals) {
    if (Opcode(inst) == kOpTypeVector && inst.size() == 4 && inst[2] == uint_ && inst[3] == 3) {
      uvec3_ = inst[1];
    }
  }
  if (uvec3_ == 0) {
    uvec3_ = m_.NewId();
    added_.push_back(Make(kOpTypeVector, {uvec3_, uint_, 3}));
  }

  // An input's vector type, component type and signedness.
  auto describe = [&](uint32_t input, Replaced& r) -> absl::Status {
    r.input = input;
    auto var = defs_.find(input);
    auto pointer = var == defs_.end() ? defs_.end() : defs_.find((*var->second)[1]);
    if (var == defs_.end() || Opcode(*var->second) != kOpVariable || pointer == defs_.end() ||
        pointer->second->size() < 4 || (*pointer->second)[2] != kStorageInput) {
      return absl::InvalidArgumentError(absl::StrCat("built-in %", input, " is no input"));
    }
    r.pointee = (*pointer->second)[3];
    auto vec = defs_.find(r.pointee);
    auto comp =
        vec == defs_.end() || vec->second->size() < 4 ? defs_.end() : defs_.find((*vec->second)[2]);
    if (comp == defs_.end() || Opcode(*vec->second) != kOpTypeVector || (*vec->second)[3] != 3 ||
        Opcode(*comp->second) != kOpTypeInt || comp->second->size() < 4 ||
        (*comp->second)[2] != 32) {
      return absl::InvalidArgumentError(
          absl::StrCat("built-in %", input, " is no 3-component vector of 32-bit integers"));
    }
    r.component = (*vec->second)[2];
    r.is_signed = (*comp->second)[3] != 0;
    return absl::OkStatus();
  };
  // The built-ins the original entry point reads are replaced; the new main reads the real
  // workgroup and local ids.
  std::optional<Replaced> workgroup_id, global_id, num_workgroups;
  for (auto [builtin, replaced] : {std::pair{kBuiltInWorkgroupId, &workgroup_id},
                                   std::pair{kBuiltInGlobalInvocationId, &global_id},
                                   std::pair{kBuiltInNumWorkgroups, &num_workgroups}}) {
    auto it = builtins_.find(builtin);
    if (it == builtins_.end()) continue;
    replaced->emplace();
    KD_RETURN_IF_ERROR(describe(it->second, **replaced));
  }
  Replaced real_workgroup;
  if (workgroup_id.has_value()) {
    real_workgroup = *workgroup_id;
  } else {
    real_workgroup = {m_.NewId(), uvec3_, uint_, false, 0};
    added_.push_back(Make(
        kOpVariable, {PointerType(kStorageInput, uvec3_), real_workgroup.input, kStorageInput}));
    decorations_.push_back(
        Make(kOpDecorate, {real_workgroup.input, kDecorationBuiltIn, kBuiltInWorkgroupId}));
  }
  Replaced local_id;
  if (global_id.has_value()) {
    if (auto it = builtins_.find(kBuiltInLocalInvocationId); it != builtins_.end()) {
      KD_RETURN_IF_ERROR(describe(it->second, local_id));
    } else {
      local_id = {m_.NewId(), uvec3_, uint_, false, 0};
      added_.push_back(
          Make(kOpVariable, {PointerType(kStorageInput, uvec3_), local_id.input, kStorageInput}));
      decorations_.push_back(
          Make(kOpDecorate, {local_id.input, kDecorationBuiltIn, kBuiltInLocalInvocationId}));
    }
  }
  for (std::optional<Replaced>* r : {&workgroup_id, &global_id, &num_workgroups}) {
    if (r->has_value()) KD_RETURN_IF_ERROR(Retarget(**r));
  }

  // The original entry point becomes a function of a new id, called by the new main, which takes
  // the entry point's id (and with it its execution modes, name and interface).
  const uint32_t body_function = m_.NewId();
  body_ = body_function;
  entry->head[0][2] = body_function;
  for (Function& f : m_.functions) {
    for (Block& b : f.blocks) {
      for (Inst& inst : b.body) {
        if (Opcode(inst) == kOpFunctionCall && inst.size() >= 4 && inst[3] == entry_) {
          inst[3] = body_function;
        }
        // Debug information inside a function (DebugFunctionDefinition) names the function.
        if (Opcode(inst) == kOpExtInst) {
          for (size_t w = 5; w < inst.size(); ++w) {
            if (inst[w] == entry_) inst[w] = body_function;
          }
        }
      }
    }
  }
  const uint32_t void_type = entry->head[0][1];
  const uint32_t function_type = entry->head[0][4];

  // main: for (v = real id; v < x*y*z; v += resident) { set the ids of v; body(); }, with v
  // kept as (v mod x, v / x) so that no value exceeds 32 bits.
  const uint32_t cx = Constant(x), cy = Constant(y), cyz = Constant(y * z), zero = Constant(0),
                 one = Constant(1), step_x = Constant(r % x), step_yz = Constant(r / x);
  Block start{m_.NewId(), {}}, header{m_.NewId(), {}}, body{m_.NewId(), {}}, next{m_.NewId(), {}},
      merge{m_.NewId(), {}};
  const std::array<uint32_t, 3> real =
      LoadUnsigned(start.body, real_workgroup.input, real_workgroup.pointee,
                   real_workgroup.component, real_workgroup.is_signed);
  const uint32_t vx0 = m_.NewId(), vyz0 = m_.NewId();
  start.body.push_back(Make(kOpUMod, {uint_, vx0, real[0], cx}));
  start.body.push_back(Make(kOpUDiv, {uint_, vyz0, real[0], cx}));
  if (num_workgroups.has_value()) {
    StoreVector(start.body, *num_workgroups, {cx, cy, Constant(z)});
  }
  std::array<uint32_t, 3> local{}, size{};
  if (global_id.has_value()) {
    local = LoadUnsigned(start.body, local_id.input, local_id.pointee, local_id.component,
                         local_id.is_signed);
    KD_ASSIGN_OR_RETURN(size, LocalSize(start.body));
  }
  start.body.push_back(Make(kOpBranch, {header.label}));

  const uint32_t vx = m_.NewId(), vyz = m_.NewId(), vx_next = m_.NewId(), vyz_next = m_.NewId(),
                 more = m_.NewId();
  header.body.push_back(Make(kOpPhi, {uint_, vx, vx0, start.label, vx_next, next.label}));
  header.body.push_back(Make(kOpPhi, {uint_, vyz, vyz0, start.label, vyz_next, next.label}));
  header.body.push_back(Make(kOpULessThan, {bool_, more, vyz, cyz}));
  header.body.push_back(Make(kOpLoopMerge, {merge.label, next.label, 0}));
  header.body.push_back(Make(kOpBranchConditional, {more, body.label, merge.label}));

  const uint32_t vy = m_.NewId(), vz = m_.NewId();
  body.body.push_back(Make(kOpUMod, {uint_, vy, vyz, cy}));
  body.body.push_back(Make(kOpUDiv, {uint_, vz, vyz, cy}));
  const std::array<uint32_t, 3> virtual_id = {vx, vy, vz};
  if (workgroup_id.has_value()) StoreVector(body.body, *workgroup_id, virtual_id);
  if (global_id.has_value()) {
    std::array<uint32_t, 3> g{};
    for (uint32_t d = 0; d < 3; ++d) {
      const uint32_t scaled = m_.NewId();
      g[d] = m_.NewId();
      body.body.push_back(Make(kOpIMul, {uint_, scaled, virtual_id[d], size[d]}));
      body.body.push_back(Make(kOpIAdd, {uint_, g[d], scaled, local[d]}));
    }
    StoreVector(body.body, *global_id, g);
  }
  body.body.push_back(Make(kOpFunctionCall, {void_type, m_.NewId(), body_function}));
  if (shared_memory) {
    body.body.push_back(
        Make(kOpControlBarrier, {Constant(kScopeWorkgroup), Constant(kScopeWorkgroup),
                                 Constant(kSemanticsAcquireRelease | kSemanticsWorkgroupMemory)}));
  }
  body.body.push_back(Make(kOpBranch, {next.label}));

  // v += resident: x by resident mod x with a carry, the rest by resident / x.
  const uint32_t ax = m_.NewId(), wraps = m_.NewId(), wrapped = m_.NewId(), carry = m_.NewId(),
                 ayz = m_.NewId();
  next.body.push_back(Make(kOpIAdd, {uint_, ax, vx, step_x}));
  next.body.push_back(Make(kOpUGreaterThanEqual, {bool_, wraps, ax, cx}));
  next.body.push_back(Make(kOpISub, {uint_, wrapped, ax, cx}));
  next.body.push_back(Make(kOpSelect, {uint_, vx_next, wraps, wrapped, ax}));
  next.body.push_back(Make(kOpSelect, {uint_, carry, wraps, one, zero}));
  next.body.push_back(Make(kOpIAdd, {uint_, ayz, vyz, step_yz}));
  next.body.push_back(Make(kOpIAdd, {uint_, vyz_next, ayz, carry}));
  next.body.push_back(Make(kOpBranch, {header.label}));
  merge.body.push_back(Make(kOpReturn, {}));

  Function main;
  main.head.push_back(Make(kOpFunction, {void_type, entry_, 0, function_type}));
  main.blocks = {std::move(start), std::move(header), std::move(body), std::move(next),
                 std::move(merge)};
  main.end = Make(kOpFunctionEnd, {});
  m_.functions.push_back(std::move(main));

  // The entry point lists the inputs it now reads, and from SPIR-V 1.4 every global variable.
  std::vector<uint32_t> read = {real_workgroup.input};
  if (global_id.has_value()) read.push_back(local_id.input);
  for (uint32_t input : read) {
    bool listed = false;
    for (size_t w = InterfaceStart(*entry_point); w < entry_point->size(); ++w) {
      listed = listed || (*entry_point)[w] == input;
    }
    if (!listed) Append(*entry_point, {input});
  }
  if (m_.version() >= 0x00010400) {
    for (std::optional<Replaced>* r : {&workgroup_id, &global_id, &num_workgroups}) {
      if (r->has_value()) Append(*entry_point, {(*r)->variable});
    }
  }
  size_t last_before_types = 0;
  for (size_t i = 0; i < m_.globals.size(); ++i) {
    if (IsBeforeTypes(Opcode(m_.globals[i]))) last_before_types = i + 1;
  }
  m_.globals.insert(m_.globals.end(), added_.begin(), added_.end());
  m_.globals.insert(m_.globals.begin() + static_cast<std::ptrdiff_t>(last_before_types),
                    decorations_.begin(), decorations_.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoopedModule> LoopOverWorkgroups(absl::Span<const uint32_t> spirv,
                                                const WorkgroupLoop& loop) {
  EditableModule m;
  KD_RETURN_IF_ERROR(m.Parse(spirv));
  Looper looper(m, loop);
  KD_RETURN_IF_ERROR(looper.Run());
  return LoopedModule{m.Serialize(), looper.main(), looper.body()};
}

}  // namespace komputed::core
