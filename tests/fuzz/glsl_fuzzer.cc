// fuzz_glsl: GLSL intake in-process. Each input (at most kMaxSource bytes; the daemon compiles
// clients' GLSL in a child process, glsl_compiler.h, and shaderc itself is not the target) is a
// compute shader's source: core::CompileGlsl, and for what compiles, core::ValidateSpirv,
// core::ShaderLocalSize and core::Algorithm::Create on the device with four tensors bound.
//
// Checked: no crash or sanitizer report in komputed's code; compile errors are INVALID_ARGUMENT;
// what shaderc compiles validates; Algorithm::Create's errors are ones that bad input may cause.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz_support.h"
#include "komputed/core/algorithm.h"
#include "komputed/core/shader.h"
#include "komputed/core/tensor.h"

namespace komputed::fuzz {
namespace {

constexpr size_t kMaxSource = 4096;

const std::vector<std::shared_ptr<core::Tensor>>& Tensors() {
  static const auto* tensors = [] {
    auto* t = new std::vector<std::shared_ptr<core::Tensor>>();
    for (int i = 0; i < 4; ++i) {
      auto tensor = core::Tensor::Create(FuzzDevice(), core::ElementType::kFloat32, /*count=*/64,
                                         /*element_size=*/4, core::MemoryType::kDevice, nullptr);
      Check(tensor.ok(), "creating the tensors", tensor.status());
      t->push_back(*std::move(tensor));
    }
    return t;
  }();
  return *tensors;
}

void Run(absl::string_view source) {
  absl::StatusOr<std::vector<uint32_t>> spirv = core::CompileGlsl(source, "fuzz");
  Check(spirv.ok() || absl::IsInvalidArgument(spirv.status()), "CompileGlsl's error",
        spirv.status());
  if (!spirv.ok()) return;
  const std::shared_ptr<core::Device>& device = FuzzDevice();
  Check(core::ValidateSpirv(*spirv, VK_API_VERSION_1_1).ok(),
        "what shaderc compiled for Vulkan 1.1 does not validate");
  core::ShaderLocalSize(*spirv, {}, 4);
  core::AlgorithmSpec spec;
  spec.tensors = Tensors();
  spec.spirv = *std::move(spirv);
  absl::StatusOr<std::shared_ptr<core::Algorithm>> algorithm =
      core::Algorithm::Create(device, spec);
  CheckClientError(algorithm.status(), "Algorithm::Create");
  CheckNoValidationErrors();
}

}  // namespace
}  // namespace komputed::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  komputed::fuzz::InitProcess();
  komputed::fuzz::Tensors();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > komputed::fuzz::kMaxSource) return -1;
  komputed::fuzz::Run(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
