// AddCancelChecks: a SPIR-V rewrite that makes dispatches stoppable (cancel_check.h), and the
// CancelWord they read.
#include "komputed/core/cancel_check.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "komputed/core/status.h"
#include "spirv_edit.h"

namespace komputed::core {
namespace {

using namespace spirv;  // NOLINT(build/namespaces): the rewrite speaks SPIR-V throughout

class Rewriter {
 public:
  absl::Status Parse(absl::Span<const uint32_t> spirv) { return m_.Parse(spirv); }
  absl::Status Rewrite(const CancelCheckOptions& options);
  std::vector<uint32_t> Serialize() const { return m_.Serialize(); }
  // LoopFreeInstructionBound of the parsed module.
  absl::StatusOr<std::optional<uint64_t>> LoopFreeBound() const;

 private:
  uint32_t NewId() { return m_.NewId(); }
  // Appends the instructions that read the cancel word; returns the id of a bool that is true
  // while the word is zero.
  uint32_t EmitNotCancelled(std::vector<Inst>& out);
  uint32_t UndefOf(uint32_t type);
  absl::Status CheckLoops(Function& f);
  void CheckEntry(Function& f);

  EditableModule m_;
  std::vector<Inst> added_globals_;
  uint32_t uint_ = 0, bool_ = 0, zero_ = 0, ptr_uint_ = 0, var_ = 0, scope_ = 0, semantics_ = 0;
  uint32_t one_ = 0, true_ = 0, interval_ = 0, ptr_function_uint_ = 0;  // the loops' countdown
  // Which copy of the word an invocation reads: from its workgroup's id.
  uint32_t workgroup_id_ = 0, id_vector_ = 0, id_component_ = 0, y_factor_ = 0, z_factor_ = 0,
           copy_mask_ = 0, copy_stride_ = 0;
  absl::flat_hash_set<uint32_t> void_types_;
  absl::flat_hash_map<uint32_t, uint32_t> undefs_;  // type → OpUndef of it
};

uint32_t Rewriter::EmitNotCancelled(std::vector<Inst>& out) {
  // The copy of the word: (x + 97 y + 89 z) mod kCancelWordCopies of the workgroup's id, so that
  // the reads of a large dispatch spread over many cache lines instead of queueing at one.
  const uint32_t ids = NewId();
  out.push_back(Make(kOpLoad, {id_vector_, ids, workgroup_id_}));
  uint32_t c[3];
  for (uint32_t d = 0; d < 3; ++d) {
    c[d] = NewId();
    out.push_back(Make(kOpCompositeExtract, {id_component_, c[d], ids, d}));
    if (id_component_ != uint_) {
      const uint32_t u = NewId();
      out.push_back(Make(kOpBitcast, {uint_, u, c[d]}));
      c[d] = u;
    }
  }
  const uint32_t y = NewId(), z = NewId(), xy = NewId(), xyz = NewId(), copy = NewId(),
                 index = NewId();
  out.push_back(Make(kOpIMul, {uint_, y, c[1], y_factor_}));
  out.push_back(Make(kOpIMul, {uint_, z, c[2], z_factor_}));
  out.push_back(Make(kOpIAdd, {uint_, xy, c[0], y}));
  out.push_back(Make(kOpIAdd, {uint_, xyz, xy, z}));
  out.push_back(Make(kOpBitwiseAnd, {uint_, copy, xyz, copy_mask_}));
  out.push_back(Make(kOpIMul, {uint_, index, copy, copy_stride_}));
  const uint32_t pointer = NewId(), word = NewId(), ok = NewId();
  out.push_back(Make(kOpAccessChain, {ptr_uint_, pointer, var_, zero_, index}));
  out.push_back(Make(kOpAtomicLoad, {uint_, word, pointer, scope_, semantics_}));
  out.push_back(Make(kOpIEqual, {bool_, ok, word, zero_}));
  return ok;
}

uint32_t Rewriter::UndefOf(uint32_t type) {
  auto [it, inserted] = undefs_.try_emplace(type, 0);
  if (inserted) {
    it->second = NewId();
    added_globals_.push_back(Make(kOpUndef, {type, it->second}));
  }
  return it->second;
}

absl::Status Rewriter::CheckLoops(Function& f) {
  absl::flat_hash_map<uint32_t, size_t> index;       // label → block position
  absl::flat_hash_map<uint32_t, uint32_t> merge_of;  // loop header → its merge block
  for (size_t i = 0; i < f.blocks.size(); ++i) {
    index[f.blocks[i].label] = i;
    const std::vector<Inst>& body = f.blocks[i].body;
    if (body.size() >= 2 && Opcode(body[body.size() - 2]) == kOpLoopMerge &&
        body[body.size() - 2].size() >= 3) {
      merge_of[f.blocks[i].label] = body[body.size() - 2][1];
    }
  }
  // A branch to a loop header from the header itself or a block after it is the back edge.
  auto back_edge = [&](uint32_t target, size_t from) {
    auto it = index.find(target);
    return merge_of.contains(target) && it != index.end() && it->second <= from;
  };
  // The back edges' new predecessors of headers and merge blocks, for their OpPhi instructions:
  // (block, old predecessor or 0 for a new edge, new predecessor).
  struct Edge {
    uint32_t to, from, now;
  };
  std::vector<Edge> edges;
  std::vector<Block> blocks;
  blocks.reserve(f.blocks.size());
  // The function's countdown to its next read of the word: a variable of its own, which the
  // driver keeps in a register (a Private one was kept in memory on the H200, five times slower).
  uint32_t ticks = 0;
  for (size_t i = 0; i < f.blocks.size(); ++i) {
    Block b = std::move(f.blocks[i]);
    Inst term = b.body.back();
    const uint32_t op = Opcode(term);
    if (op == kOpSwitch) {
      // (The default target and every case's; a literal that happens to equal a header's id
      // refuses the module too, which errs on the safe side.)
      for (size_t w = 2; w < term.size(); ++w) {
        if (back_edge(term[w], i)) {
          return absl::InvalidArgumentError(
              absl::StrCat("block %", b.label,
                           " returns to its loop through OpSwitch: loops of that form "
                           "cannot be stopped by the daemon's kernel watchdog"));
        }
      }
    }
    const bool is_back_edge = (op == kOpBranch && term.size() >= 2 && back_edge(term[1], i)) ||
                              (op == kOpBranchConditional && term.size() >= 4 &&
                               (back_edge(term[2], i) || back_edge(term[3], i)));
    if (!is_back_edge) {
      blocks.push_back(std::move(b));
      continue;
    }
    const uint32_t header = op == kOpBranch ? term[1] : (back_edge(term[2], i) ? term[2] : term[3]);
    const uint32_t merge = merge_of[header];
    b.body.pop_back();
    if (!b.body.empty() && Opcode(b.body.back()) == kOpSelectionMerge) {
      return absl::InvalidArgumentError(
          absl::StrCat("block %", b.label,
                       " is both a selection header and a loop's back edge: loops of "
                       "that form cannot be stopped by the daemon's kernel watchdog"));
    }
    // A header that is its own back edge (and continue target) gets a new continue target,
    // which counts; any other back-edge block counts itself.
    Block counting{b.label, {}};
    if (!b.body.empty() && Opcode(b.body.back()) == kOpLoopMerge) {
      counting.label = NewId();
      b.body.back()[2] = counting.label;
      b.body.push_back(Make(kOpBranch, {counting.label}));
      blocks.push_back(std::move(b));
    } else {
      counting.body = std::move(b.body);
    }
    // counting: the countdown; at zero it starts again and `reading` reads the word.
    // decided: whether to go round again, from the loop's own condition and the word.
    Block reading{NewId(), {}};
    Block decided{NewId(), {}};
    const uint32_t left = NewId(), next = NewId(), due = NewId(), stored = NewId();
    if (ticks == 0) ticks = NewId();
    counting.body.push_back(Make(kOpLoad, {uint_, left, ticks}));
    counting.body.push_back(Make(kOpISub, {uint_, next, left, one_}));
    counting.body.push_back(Make(kOpIEqual, {bool_, due, next, zero_}));
    counting.body.push_back(Make(kOpSelect, {uint_, stored, due, interval_, next}));
    counting.body.push_back(Make(kOpStore, {ticks, stored}));
    counting.body.push_back(Make(kOpSelectionMerge, {decided.label, 0}));
    counting.body.push_back(Make(kOpBranchConditional, {due, reading.label, decided.label}));
    const uint32_t read_ok = EmitNotCancelled(reading.body);
    reading.body.push_back(Make(kOpBranch, {decided.label}));
    const uint32_t ok = NewId();
    decided.body.push_back(
        Make(kOpPhi, {bool_, ok, true_, counting.label, read_ok, reading.label}));

    Inst branch;
    bool adds_merge_edge = true;
    if (op == kOpBranch || term[2] == term[3]) {
      branch = Make(kOpBranchConditional, {ok, header, merge});
    } else {
      const bool header_on_true = term[2] == header;
      const uint32_t other = header_on_true ? term[3] : term[2];
      if (other != merge) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block %", b.label, " returns to its loop and branches to %", other,
            ", which is not the loop's merge block: loops of that form cannot be stopped by "
            "the daemon's kernel watchdog"));
      }
      adds_merge_edge = false;
      const uint32_t condition = NewId();
      if (header_on_true) {
        decided.body.push_back(Make(kOpLogicalAnd, {bool_, condition, term[1], ok}));
        branch = Make(kOpBranchConditional, {condition, header, merge});
      } else {
        const uint32_t cancelled = NewId();
        decided.body.push_back(Make(kOpLogicalNot, {bool_, cancelled, ok}));
        decided.body.push_back(Make(kOpLogicalOr, {bool_, condition, term[1], cancelled}));
        branch = Make(kOpBranchConditional, {condition, merge, header});
      }
    }
    decided.body.push_back(std::move(branch));
    edges.push_back({header, b.label, decided.label});
    edges.push_back({merge, adds_merge_edge ? 0 : b.label, decided.label});
    blocks.push_back(std::move(counting));
    blocks.push_back(std::move(reading));
    blocks.push_back(std::move(decided));
  }
  f.blocks = std::move(blocks);
  if (ticks != 0) {
    f.blocks[0].body.insert(
        f.blocks[0].body.begin(),
        Make(kOpVariable, {ptr_function_uint_, ticks, kStorageFunction, interval_}));
  }
  index.clear();
  for (size_t i = 0; i < f.blocks.size(); ++i) index[f.blocks[i].label] = i;
  // OpPhi instructions name the block that now branches in; on a new edge to a merge block they
  // take an undefined value (the loop was left early: what follows it does not matter any more).
  // The merge block of a loop that never ended is unreachable: it returns instead.
  for (const Edge& e : edges) {
    auto it = index.find(e.to);
    if (it == index.end()) continue;
    std::vector<Inst>& body = f.blocks[it->second].body;
    if (e.from == 0 && Opcode(body.back()) == kOpUnreachable) {
      const uint32_t result_type = f.head[0][1];
      body.back() = void_types_.contains(result_type)
                        ? Make(kOpReturn, {})
                        : Make(kOpReturnValue, {UndefOf(result_type)});
    }
    for (Inst& inst : body) {
      const uint32_t phi_op = Opcode(inst);
      if (phi_op == kOpLine || phi_op == kOpNoLine) continue;
      if (phi_op != kOpPhi) break;
      bool has = false;
      for (size_t w = 4; w < inst.size(); w += 2) {
        if (e.from != 0 && inst[w] == e.from) inst[w] = e.now;
        has = has || inst[w] == e.now;
      }
      if (!has) Append(inst, {UndefOf(inst[1]), e.now});
    }
  }
  return absl::OkStatus();
}

void Rewriter::CheckEntry(Function& f) {
  if (f.blocks.empty()) return;
  // A new first block keeps the function's variables, reads the word and returns when it is set;
  // the old first block, with its label, follows.
  Block& old_first = f.blocks[0];
  Block first{NewId(), {}};
  size_t k = 0;
  while (k < old_first.body.size()) {
    const uint32_t op = Opcode(old_first.body[k]);
    if (op != kOpVariable && op != kOpLine && op != kOpNoLine) break;
    ++k;
  }
  first.body.assign(old_first.body.begin(),
                    old_first.body.begin() + static_cast<std::ptrdiff_t>(k));
  old_first.body.erase(old_first.body.begin(),
                       old_first.body.begin() + static_cast<std::ptrdiff_t>(k));
  const uint32_t ok = EmitNotCancelled(first.body);
  Block stop{NewId(), {Make(kOpReturn, {})}};
  first.body.push_back(Make(kOpSelectionMerge, {old_first.label, 0}));
  first.body.push_back(Make(kOpBranchConditional, {ok, old_first.label, stop.label}));
  f.blocks.insert(f.blocks.begin(), {std::move(first), std::move(stop)});
}

absl::Status Rewriter::Rewrite(const CancelCheckOptions& options) {
  if (options.interval == 0) return absl::InvalidArgumentError("a cancel check interval of 0");
  const uint32_t version = m_.version();
  bool has_storage_buffer_ext = false, vulkan_memory_model = false;
  absl::flat_hash_set<uint32_t> compute_entries;
  for (const Inst& inst : m_.globals) {
    const uint32_t op = Opcode(inst);
    if (op == kOpMemoryModel && inst.size() >= 3 && inst[1] != kAddressingLogical) {
      return absl::InvalidArgumentError("only modules with Logical addressing can be stopped");
    }
    if (op == kOpCapability && inst.size() >= 2 && inst[1] == kCapabilityVulkanMemoryModel) {
      vulkan_memory_model = true;
    }
    if (op == kOpExtension && LiteralString(inst, 1) == "SPV_KHR_storage_buffer_storage_class") {
      has_storage_buffer_ext = true;
    }
    if (op == kOpEntryPoint && inst.size() >= 3 && inst[1] == kGLCompute) {
      compute_entries.insert(inst[2]);
    }
    if (op == kOpTypeInt && inst.size() == 4 && inst[2] == 32 && inst[3] == 0) uint_ = inst[1];
    if (op == kOpTypeBool && inst.size() == 2) bool_ = inst[1];
    if (op == kOpTypeVoid && inst.size() == 2) void_types_.insert(inst[1]);
  }

  // Declarations: types the module lacks, the word's block, pointer and variable.
  if (uint_ == 0) {
    uint_ = NewId();
    added_globals_.push_back(Make(kOpTypeInt, {uint_, 32, 0}));
  }
  if (bool_ == 0) {
    bool_ = NewId();
    added_globals_.push_back(Make(kOpTypeBool, {bool_}));
  }
  auto constant = [&](uint32_t value) {
    const uint32_t id = NewId();
    added_globals_.push_back(Make(kOpConstant, {uint_, id, value}));
    return id;
  };
  zero_ = constant(0);
  constexpr uint32_t kStrideWords = kCancelWordStrideBytes / 4;
  static_assert((kCancelWordCopies & (kCancelWordCopies - 1)) == 0);
  const uint32_t length = constant(kCancelWordCopies * kStrideWords);
  copy_mask_ = constant(kCancelWordCopies - 1);
  copy_stride_ = constant(kStrideWords);
  y_factor_ = constant(97);
  z_factor_ = constant(89);
  // The word's block: the copies, kStrideWords apart.
  const uint32_t array = NewId(), block = NewId(), ptr_block = NewId();
  ptr_uint_ = NewId();
  var_ = NewId();
  added_globals_.push_back(Make(kOpTypeArray, {array, uint_, length}));
  added_globals_.push_back(Make(kOpTypeStruct, {block, array}));
  added_globals_.push_back(Make(kOpTypePointer, {ptr_block, kStorageBuffer, block}));
  added_globals_.push_back(Make(kOpTypePointer, {ptr_uint_, kStorageBuffer, uint_}));
  added_globals_.push_back(Make(kOpVariable, {ptr_block, var_, kStorageBuffer}));
  // The workgroup's id: the module's own WorkgroupId variable, or a new one (an entry point's
  // inputs may carry a built-in only once).
  for (const Inst& inst : m_.globals) {
    if (Opcode(inst) == kOpDecorate && inst.size() >= 4 && inst[2] == kDecorationBuiltIn &&
        inst[3] == kBuiltInWorkgroupId) {
      workgroup_id_ = inst[1];
    }
  }
  const bool own_workgroup_id = workgroup_id_ == 0;
  if (!own_workgroup_id) {
    absl::flat_hash_map<uint32_t, const Inst*> defs;
    for (const Inst& inst : m_.globals) {
      const uint32_t op = Opcode(inst);
      if (op == kOpVariable && inst.size() >= 3) defs[inst[2]] = &inst;
      if ((op == kOpTypePointer || op == kOpTypeVector) && inst.size() >= 2) defs[inst[1]] = &inst;
    }
    auto def = [&](uint32_t id) -> const Inst* {
      auto it = defs.find(id);
      return it == defs.end() ? nullptr : it->second;
    };
    const Inst* var = def(workgroup_id_);
    const Inst* pointer = var != nullptr && Opcode(*var) == kOpVariable ? def((*var)[1]) : nullptr;
    const Inst* vector =
        pointer != nullptr && Opcode(*pointer) == kOpTypePointer && pointer->size() >= 4
            ? def((*pointer)[3])
            : nullptr;
    if (vector == nullptr || Opcode(*vector) != kOpTypeVector || vector->size() < 4 ||
        (*vector)[3] != 3) {
      return absl::InvalidArgumentError("the WorkgroupId built-in is not a 3-component vector");
    }
    id_vector_ = (*vector)[1];
    id_component_ = (*vector)[2];
  } else {
    for (const Inst& inst : m_.globals) {
      if (Opcode(inst) == kOpTypeVector && inst.size() == 4 && inst[2] == uint_ && inst[3] == 3) {
        id_vector_ = inst[1];
      }
    }
    if (id_vector_ == 0) {
      id_vector_ = NewId();
      added_globals_.push_back(Make(kOpTypeVector, {id_vector_, uint_, 3}));
    }
    id_component_ = uint_;
    const uint32_t ptr_input = NewId();
    workgroup_id_ = NewId();
    added_globals_.push_back(Make(kOpTypePointer, {ptr_input, kStorageInput, id_vector_}));
    added_globals_.push_back(Make(kOpVariable, {ptr_input, workgroup_id_, kStorageInput}));
  }
  scope_ = NewId();
  added_globals_.push_back(
      Make(kOpConstant, {uint_, scope_, vulkan_memory_model ? kScopeQueueFamily : kScopeDevice}));
  semantics_ = zero_;
  static_assert(kSemanticsRelaxed == 0);
  // The functions' countdowns to their next read of the word.
  ptr_function_uint_ = NewId();
  one_ = NewId();
  true_ = NewId();
  interval_ = NewId();
  added_globals_.push_back(Make(kOpConstant, {uint_, one_, 1}));
  added_globals_.push_back(Make(kOpConstantTrue, {bool_, true_}));
  added_globals_.push_back(Make(kOpConstant, {uint_, interval_, options.interval}));
  added_globals_.push_back(Make(kOpTypePointer, {ptr_function_uint_, kStorageFunction, uint_}));
  std::vector<Inst> decorations = {
      Make(kOpDecorate, {array, kDecorationArrayStride, 4}),
      Make(kOpDecorate, {block, kDecorationBlock}),
      Make(kOpMemberDecorate, {block, 0, kDecorationOffset, 0}),
      Make(kOpDecorate, {var_, kDecorationDescriptorSet, options.set}),
      Make(kOpDecorate, {var_, kDecorationBinding, options.binding}),
  };
  if (own_workgroup_id) {
    decorations.push_back(
        Make(kOpDecorate, {workgroup_id_, kDecorationBuiltIn, kBuiltInWorkgroupId}));
  }

  auto listed = [](const std::vector<uint32_t>& ids, uint32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (Function& f : m_.functions) {
    if (!listed(options.unchecked_loop_functions, f.id())) KD_RETURN_IF_ERROR(CheckLoops(f));
  }
  for (Function& f : m_.functions) {
    if ((options.check_entry && compute_entries.contains(f.id())) ||
        listed(options.entry_checked_functions, f.id())) {
      CheckEntry(f);
    }
  }

  // Place the new global instructions where the layout wants them.
  size_t last_before_types = 0, last_capability = 0;
  for (size_t i = 0; i < m_.globals.size(); ++i) {
    const uint32_t op = Opcode(m_.globals[i]);
    if (IsBeforeTypes(op)) last_before_types = i + 1;
    if (op == kOpCapability) last_capability = i + 1;
    if (op != kOpEntryPoint) continue;
    // An entry point lists the inputs it uses, and from SPIR-V 1.4 every global variable.
    if (version >= 0x00010400) Append(m_.globals[i], {var_});
    bool listed = false;
    for (size_t w = InterfaceStart(m_.globals[i]); w < m_.globals[i].size(); ++w) {
      listed = listed || m_.globals[i][w] == workgroup_id_;
    }
    if (!listed) Append(m_.globals[i], {workgroup_id_});
  }
  m_.globals.insert(m_.globals.end(), added_globals_.begin(), added_globals_.end());
  m_.globals.insert(m_.globals.begin() + static_cast<std::ptrdiff_t>(last_before_types),
                    decorations.begin(), decorations.end());
  if (version < 0x00010300 && !has_storage_buffer_ext) {
    Inst extension = Make(kOpExtension, {});
    for (uint32_t w : Literal("SPV_KHR_storage_buffer_storage_class")) Append(extension, {w});
    m_.globals.insert(m_.globals.begin() + static_cast<std::ptrdiff_t>(last_capability),
                      std::move(extension));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> Rewriter::LoopFreeBound() const {
  absl::flat_hash_map<uint32_t, const Function*> by_id;
  for (const Function& f : m_.functions) {
    if (f.head[0].size() >= 3) by_id[f.head[0][2]] = &f;
    for (const Block& b : f.blocks) {
      for (const Inst& inst : b.body) {
        if (Opcode(inst) == kOpLoopMerge) return std::nullopt;
      }
    }
  }
  auto add = [](uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
  // Each function's bound, its callees' first (a call graph has no cycles in valid SPIR-V).
  absl::flat_hash_map<uint32_t, uint64_t> bound;
  absl::flat_hash_set<uint32_t> open;
  std::function<absl::StatusOr<uint64_t>(uint32_t)> of =
      [&](uint32_t id) -> absl::StatusOr<uint64_t> {
    if (auto it = bound.find(id); it != bound.end()) return it->second;
    auto f = by_id.find(id);
    if (f == by_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat("a call of %", id, ", which is no function"));
    }
    if (!open.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("function %", id, " calls itself"));
    }
    uint64_t n = 0;
    for (const Block& b : f->second->blocks) {
      n = add(n, b.body.size() + 1);
      for (const Inst& inst : b.body) {
        if (Opcode(inst) != kOpFunctionCall || inst.size() < 4) continue;
        KD_ASSIGN_OR_RETURN(const uint64_t callee, of(inst[3]));
        n = add(n, callee);
      }
    }
    open.erase(id);
    bound[id] = n;
    return n;
  };
  uint64_t most = 0;
  for (const Inst& inst : m_.globals) {
    if (Opcode(inst) != kOpEntryPoint || inst.size() < 3 || inst[1] != kGLCompute) continue;
    KD_ASSIGN_OR_RETURN(const uint64_t n, of(inst[2]));
    most = std::max(most, n);
  }
  return most;
}

}  // namespace

absl::StatusOr<std::optional<uint64_t>> LoopFreeInstructionBound(absl::Span<const uint32_t> spirv) {
  Rewriter rewriter;
  KD_RETURN_IF_ERROR(rewriter.Parse(spirv));
  return rewriter.LoopFreeBound();
}

absl::StatusOr<std::vector<uint32_t>> AddCancelChecks(absl::Span<const uint32_t> spirv,
                                                      const CancelCheckOptions& options) {
  Rewriter rewriter;
  KD_RETURN_IF_ERROR(rewriter.Parse(spirv));
  KD_RETURN_IF_ERROR(rewriter.Rewrite(options));
  return rewriter.Serialize();
}

uint64_t UncheckedWorkLimit(const Device& device) {
  return device.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? uint64_t{1} << 32
                                                                       : uint64_t{1} << 40;
}

// The words of one slab: slots slot_bytes apart, each slot's copies kCancelWordStrideBytes apart.
struct CancelWord::Slab {
  std::shared_ptr<Device> device;
  std::shared_ptr<const void> slabs;  // the device's CancelSlabs, kept while this slab lives
  Buffer buffer;                      // destroyed before the device
  uint64_t slot_bytes = 0;
  absl::Mutex mu;
  std::vector<uint32_t> free ABSL_GUARDED_BY(mu);  // slots no word holds
};

namespace {

constexpr char kCancelSlabsKey[] = "cancel word slabs";

// The slabs of a device, filed with Device::Share: it lives while any slab does. Its members are
// mutable because what Device::Share files is const; they are guarded by mu.
struct CancelSlabs {
  mutable absl::Mutex mu;
  mutable std::vector<std::weak_ptr<CancelWord::Slab>> slabs ABSL_GUARDED_BY(mu);
};

// Words per slab: each slot where a descriptor may begin (the device's offset alignment, and at
// least 16 bytes, so that a cache line's readers stay few), as many as fit in one stride.
uint64_t SlotBytes(const Device& device) {
  return std::max<uint64_t>(16, device.limits().minStorageBufferOffsetAlignment);
}

}  // namespace

absl::StatusOr<std::shared_ptr<CancelWord>> CancelWord::Create(std::shared_ptr<Device> device) {
  auto pool = std::static_pointer_cast<const CancelSlabs>(device->Shared(kCancelSlabsKey));
  if (pool == nullptr) {
    pool = std::static_pointer_cast<const CancelSlabs>(device->Share(
        kCancelSlabsKey, std::shared_ptr<const CancelSlabs>(std::make_shared<CancelSlabs>())));
  }
  auto word = std::shared_ptr<CancelWord>(new CancelWord());
  absl::MutexLock lock(&pool->mu);
  for (auto it = pool->slabs.begin(); it != pool->slabs.end() && word->slab_ == nullptr;) {
    std::shared_ptr<Slab> slab = it->lock();
    if (slab == nullptr) {
      it = pool->slabs.erase(it);
      continue;
    }
    absl::MutexLock slab_lock(&slab->mu);
    if (!slab->free.empty()) {
      word->slot_ = slab->free.back();
      slab->free.pop_back();
      word->slab_ = std::move(slab);
    }
    ++it;
  }
  if (word->slab_ == nullptr) {
    auto slab = std::make_shared<Slab>();
    slab->slot_bytes = SlotBytes(*device);
    const uint64_t slots = std::max<uint64_t>(1, kCancelWordStrideBytes / slab->slot_bytes);
    KD_ASSIGN_OR_RETURN(
        slab->buffer,
        Buffer::Create(*device, (slots - 1) * slab->slot_bytes + kCancelWordBytes,
                       VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                       VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                       // Device memory the host maps, where the GPU has one: new invocations see
                       // the host's write there (cached host memory they did not see, on NVIDIA).
                       VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "cancel words"));
    std::memset(slab->buffer.mapped(), 0, slab->buffer.size());
    slab->device = std::move(device);
    slab->slabs = pool;
    {
      absl::MutexLock slab_lock(&slab->mu);
      for (uint64_t s = slots - 1; s > 0; --s) slab->free.push_back(static_cast<uint32_t>(s));
    }
    pool->slabs.push_back(slab);
    word->slot_ = 0;
    word->slab_ = std::move(slab);
  }
  word->offset_ = word->slot_ * word->slab_->slot_bytes;
  word->Store(0);  // a slot handed out before may have been set
  return word;
}

CancelWord::~CancelWord() {
  if (slab_ == nullptr) return;
  absl::MutexLock lock(&slab_->mu);
  slab_->free.push_back(slot_);
}

VkBuffer CancelWord::buffer() const { return slab_->buffer.handle(); }

uint32_t* CancelWord::words() const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(slab_->buffer.mapped()) + offset_);
}

void CancelWord::Store(uint32_t value) {
  uint32_t* words = this->words();
  for (uint32_t c = 0; c < kCancelWordCopies; ++c) {
    std::atomic_ref<uint32_t>(words[c * (kCancelWordStrideBytes / 4)])
        .store(value, std::memory_order_seq_cst);
  }
}

void CancelWord::Set() { Store(1); }

bool CancelWord::set() const {
  return std::atomic_ref<uint32_t>(*words()).load(std::memory_order_seq_cst) != 0;
}

}  // namespace komputed::core
