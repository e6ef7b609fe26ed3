#include "spirv_edit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace komputed::core::spirv {

bool IsBeforeTypes(uint32_t op) {
  return (op >= 2 && op <= 7) || op == 10 || op == 11 || op == 14 || op == 15 || op == 16 ||
         op == 17 || (op >= 71 && op <= 75) || op == 330 || op == 331 || op == 332 || op == 5632 ||
         op == 5633;
}

bool IsTerminator(uint32_t op) {
  return (op >= kOpBranch && op <= 255) || op == 4416 || op == 4448 || op == 4449 || op == 5294;
}

Inst Make(uint32_t opcode, std::initializer_list<uint32_t> operands) {
  Inst inst;
  inst.reserve(operands.size() + 1);
  inst.push_back(static_cast<uint32_t>((operands.size() + 1) << 16) | opcode);
  inst.insert(inst.end(), operands);
  return inst;
}

void Append(Inst& inst, std::initializer_list<uint32_t> operands) {
  inst.insert(inst.end(), operands);
  inst[0] = static_cast<uint32_t>(inst.size() << 16) | Opcode(inst);
}

std::vector<uint32_t> Literal(absl::string_view s) {
  std::vector<uint32_t> words(s.size() / 4 + 1, 0);
  std::memcpy(words.data(), s.data(), s.size());
  return words;
}

std::string LiteralString(absl::Span<const uint32_t> words, size_t from) {
  std::string s;
  for (size_t i = from; i < words.size(); ++i) {
    for (int b = 0; b < 4; ++b) {
      const char c = static_cast<char>((words[i] >> (8 * b)) & 0xff);
      if (c == '\0') return s;
      s.push_back(c);
    }
  }
  return s;
}

size_t InterfaceStart(const Inst& entry_point) {
  // The name's words: up to the one that holds its NUL, whatever padding follows the NUL there.
  // A name without a NUL leaves no interface.
  return std::min(3 + LiteralString(entry_point, 3).size() / 4 + 1, entry_point.size());
}

absl::Status EditableModule::Parse(absl::Span<const uint32_t> spirv) {
  if (spirv.size() < 5) return absl::InvalidArgumentError("SPIR-V shorter than its header");
  std::memcpy(header, spirv.data(), sizeof(header));
  bound = header[3];
  Function* f = nullptr;
  for (size_t at = 5; at < spirv.size();) {
    const uint32_t words = spirv[at] >> 16;
    if (words == 0 || at + words > spirv.size()) {
      return absl::InvalidArgumentError(absl::StrCat("malformed instruction at word ", at));
    }
    Inst inst(spirv.begin() + at, spirv.begin() + at + words);
    at += words;
    const uint32_t op = Opcode(inst);
    if (f == nullptr) {
      if (op != kOpFunction) {
        globals.push_back(std::move(inst));
        continue;
      }
      functions.emplace_back();
      f = &functions.back();
      f->head.push_back(std::move(inst));
    } else if (op == kOpFunctionParameter && f->blocks.empty()) {
      f->head.push_back(std::move(inst));
    } else if (op == kOpLabel && words >= 2) {
      f->blocks.push_back({inst[1], {}});
    } else if (op == kOpFunctionEnd) {
      f->end = std::move(inst);
      f = nullptr;
    } else if (f->blocks.empty()) {
      return absl::InvalidArgumentError("an instruction outside any block of a function");
    } else {
      f->blocks.back().body.push_back(std::move(inst));
    }
  }
  if (f != nullptr) return absl::InvalidArgumentError("a function without OpFunctionEnd");
  for (const Function& fn : functions) {
    for (const Block& b : fn.blocks) {
      if (b.body.empty() || !IsTerminator(Opcode(b.body.back()))) {
        return absl::InvalidArgumentError(absl::StrCat("block %", b.label, " has no terminator"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<uint32_t> EditableModule::Serialize() const {
  std::vector<uint32_t> out(header, header + 5);
  out[3] = bound;
  auto put = [&](const Inst& inst) { out.insert(out.end(), inst.begin(), inst.end()); };
  for (const Inst& inst : globals) put(inst);
  for (const Function& f : functions) {
    for (const Inst& inst : f.head) put(inst);
    for (const Block& b : f.blocks) {
      put(Make(kOpLabel, {b.label}));
      for (const Inst& inst : b.body) put(inst);
    }
    put(f.end);
  }
  return out;
}

}  // namespace komputed::core::spirv
