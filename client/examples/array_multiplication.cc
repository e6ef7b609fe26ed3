// Multiplies two arrays on the GPU and accumulates constants into two outputs, twice: once with
// the algorithm's push constant, once with an override. Prints {4, 8, 12} and {10, 10, 10}.
// Runs in-process on the local Vulkan device, or on a komputed daemon when KOMPUTED_ADDRESS is set.
#include <iostream>
#include <kompute/Kompute.hpp>

namespace {

constexpr char kShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer InA { float in_a[]; };
  layout(set = 0, binding = 1) buffer InB { float in_b[]; };
  layout(set = 0, binding = 2) buffer OutA { uint out_a[]; };
  layout(set = 0, binding = 3) buffer OutB { uint out_b[]; };
  layout(push_constant) uniform Push { float scale; } push;
  layout(constant_id = 0) const float kFactor = 0;
  void main() {
    uint i = gl_GlobalInvocationID.x;
    out_a[i] += uint(in_a[i] * in_b[i]);
    out_b[i] += uint(kFactor * push.scale);
  }
)";

void Print(const char* name, const std::vector<uint32_t>& values) {
  std::cout << name << ":";
  for (uint32_t v : values) std::cout << " " << v;
  std::cout << "\n";
}

}  // namespace

int main() {
  try {
    kp::Manager mgr;
    std::cout << "device: " << mgr.getDeviceProperties().deviceName << "\n";

    auto a = mgr.tensor({2, 2, 2});
    auto b = mgr.tensor({1, 2, 3});
    auto out_a = mgr.tensorT<uint32_t>({0, 0, 0});
    auto out_b = mgr.tensorT<uint32_t>({0, 0, 0});
    std::vector<std::shared_ptr<kp::Tensor>> params = {a, b, out_a, out_b};

    auto algo = mgr.algorithm(params, kp::compileSource(kShader), kp::Workgroup({3, 1, 1}),
                              std::vector<float>{2}, std::vector<float>{2});

    mgr.sequence()
        ->record<kp::OpTensorSyncDevice>(params)
        ->record<kp::OpAlgoDispatch>(algo)
        ->eval()
        ->record<kp::OpAlgoDispatch>(algo, std::vector<float>{3})
        ->eval();

    auto seq = mgr.sequence();
    seq->evalAsync<kp::OpTensorSyncLocal>(params);
    seq->evalAwait();

    Print("out_a", out_a->vector());
    Print("out_b", out_b->vector());
    return 0;
  } catch (const kp::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
