// fuzz_spirv: SPIR-V module intake on a real device. Each input is 4 bytes of settings followed by
// the module's bytes (as little-endian 32-bit words; a trailing partial word is dropped), taken
// through core::ValidateSpirv (each Vulkan version), core::ShaderLocalSize and
// core::Algorithm::Create (then Rebuild) with the tensors, push constants, specialization
// constants and workgroup count that the settings choose.
//
// Settings: byte 0, bits 0-2: tensors bound (0-7, of the process's 8: device, host, device, ...);
// bit 3: rebuild after creating; bit 4: with the kernel watchdog's cancel word (the module is
// rewritten by core::AddCancelChecks, as the daemon does); bit 5: with a bound on resident
// workgroups (the dispatch loops over fewer: core::LoopOverWorkgroups). Byte 1: push-constant bytes
// (modulo 129). Byte 2, bits 0-2: specialization constants; bits 3-4: their size (4, 8, 1 or 0
// bytes). Byte 3: the workgroup count in x (0 included).
//
// Checked: no crash or sanitizer report; every error is one that bad input may cause (a module
// that reaches the driver and fails there is a finding: invalid SPIR-V must never reach it);
// Algorithm::Create succeeds only for a module that ValidateSpirv accepts; AddCancelChecks takes
// every valid module without a crash, and its errors are INVALID_ARGUMENT; LoopOverWorkgroups
// takes every valid module and returns a valid one or INVALID_ARGUMENT or UNIMPLEMENTED. Every
// module reaches
// Algorithm::Create: its intake (core/src/shader_intake.cc) is what keeps the driver safe.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_support.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/cancel_check.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"
#include "komputed/core/workgroup_loop.h"

namespace komputed::fuzz {
namespace {

constexpr size_t kSettings = 4;

const std::vector<std::shared_ptr<core::Tensor>>& Tensors() {
  static const auto* tensors = [] {
    auto* t = new std::vector<std::shared_ptr<core::Tensor>>();
    for (int i = 0; i < 8; ++i) {
      const core::MemoryType memory =
          i % 2 == 0 ? core::MemoryType::kDevice : core::MemoryType::kHost;
      auto tensor = core::Tensor::Create(FuzzDevice(), core::ElementType::kFloat32, /*count=*/64,
                                         /*element_size=*/4, memory, nullptr);
      Check(tensor.ok(), "creating the tensors", tensor.status());
      t->push_back(*std::move(tensor));
    }
    return t;
  }();
  return *tensors;
}

// The cancel word of the process (the daemon has one per session).
const std::shared_ptr<core::CancelWord>& Cancel() {
  static const auto* word = [] {
    auto w = core::CancelWord::Create(FuzzDevice());
    Check(w.ok(), "creating the cancel word", w.status());
    return new std::shared_ptr<core::CancelWord>(*std::move(w));
  }();
  return *word;
}

void Run(const uint8_t* settings, const uint8_t* bytes, size_t size) {
  std::vector<uint32_t> words(size / 4);
  if (!words.empty()) std::memcpy(words.data(), bytes, words.size() * 4);
  const std::shared_ptr<core::Device>& device = FuzzDevice();

  const uint32_t api = device->properties().apiVersion;
  bool valid_for_device = false;
  for (uint32_t minor = 0; minor <= 3; ++minor) {
    const absl::Status valid = core::ValidateSpirv(words, VK_MAKE_API_VERSION(0, 1, minor, 0));
    Check(valid.ok() || absl::IsInvalidArgument(valid), "ValidateSpirv's error", valid);
    if (minor == std::min<uint32_t>(VK_API_VERSION_MINOR(api), 3)) valid_for_device = valid.ok();
  }

  if (valid_for_device) {
    const absl::StatusOr<std::vector<uint32_t>> stoppable = core::AddCancelChecks(words);
    Check(stoppable.ok() || absl::IsInvalidArgument(stoppable.status()), "AddCancelChecks' error",
          stoppable.status());
    const absl::StatusOr<core::LoopedModule> looped =
        core::LoopOverWorkgroups(words, {{5, 3, 2}, 4});
    Check(looped.ok() || absl::IsInvalidArgument(looped.status()) ||
              absl::IsUnimplemented(looped.status()),
          "LoopOverWorkgroups' error", looped.status());
    if (looped.ok()) {
      const absl::Status valid = core::ValidateSpirv(looped->spirv, api);
      Check(valid.ok(), "LoopOverWorkgroups made an invalid module", valid);
    }
  }

  core::AlgorithmSpec spec;
  if ((settings[0] & 16) != 0) spec.cancel = Cancel();
  const std::vector<std::shared_ptr<core::Tensor>>& tensors = Tensors();
  spec.tensors.assign(tensors.begin(), tensors.begin() + (settings[0] & 7));
  spec.spirv = std::move(words);
  spec.workgroup = {settings[3], 1, 1};
  if ((settings[0] & 32) != 0) spec.resident_workgroups = 1 + settings[3] / 3;
  spec.push_constants.resize(settings[1] % 129);
  for (size_t i = 0; i < spec.push_constants.size(); ++i) spec.push_constants[i] = uint8_t(i);
  static constexpr uint32_t kSpecSizes[] = {4, 8, 1, 0};
  spec.spec_constant_size = kSpecSizes[(settings[2] >> 3) & 3];
  spec.spec_constants.resize(size_t{settings[2] & 7u} *
                             std::max<uint32_t>(spec.spec_constant_size, 1));
  for (size_t i = 0; i < spec.spec_constants.size(); ++i) spec.spec_constants[i] = uint8_t(i + 1);

  // Any words give some size (shader.h); the dispatch quota reads it before the module is valid.
  core::ShaderLocalSize(spec.spirv, spec.spec_constants, spec.spec_constant_size);

  absl::StatusOr<std::shared_ptr<core::Algorithm>> algorithm =
      core::Algorithm::Create(device, spec);
  CheckClientError(algorithm.status(), "Algorithm::Create");
  Check(!algorithm.ok() || valid_for_device,
        "Algorithm::Create accepted SPIR-V that ValidateSpirv rejects");
  if (algorithm.ok() && (settings[0] & 8) != 0) {
    CheckClientError((*algorithm)->Rebuild(spec), "Algorithm::Rebuild");
  }
  CheckNoValidationErrors();
}

}  // namespace
}  // namespace komputed::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  komputed::fuzz::InitProcess();
  komputed::fuzz::Tensors();
  komputed::fuzz::Cancel();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < komputed::fuzz::kSettings) return -1;
  komputed::fuzz::Run(data, data + komputed::fuzz::kSettings, size - komputed::fuzz::kSettings);
  return 0;
}
