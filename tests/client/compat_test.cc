// Source compatibility with Kompute programs: call forms that must compile and work unchanged.
#include "kp_test.h"

namespace kptest {
namespace {

// Kompute's Sequence::record/eval/evalAsync<T> take the tensors (or the algorithm) as their first
// parameter, so programs pass braced lists: `sq->eval<kp::OpTensorSyncDevice>({a, b})`,
// `record<kp::OpMult>({a, b, c}, algo)`. (A regression here fails to compile.)
TEST_P(KpTest, OpsTakeBracedTensorLists) {
  auto a = mgr().tensor({1, 2});
  auto b = mgr().tensor({3, 4});
  auto c = mgr().tensor({0, 0});
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorSyncDevice>({a, b})
      ->record<kp::OpMult>({a, b, c}, mgr().algorithm())
      ->eval();
  seq->eval<kp::OpTensorSyncLocal>({c});
  EXPECT_EQ(c->vector(), (std::vector<float>{3, 8}));
  seq->evalAsync<kp::OpTensorCopy>({c, a});
  seq->evalAwait();
  EXPECT_EQ(a->vector(), (std::vector<float>{3, 8}));
  seq->record<kp::OpMemoryBarrier>(
         {a}, vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eShaderRead,
         vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eComputeShader)
      ->eval();
}

// Kompute programs name one queue family explicitly: `kp::Manager mgr(0, {0})`,
// `kp::Manager mgr(0, {family}, {})`. Checked in a requires-expression so that a regression
// fails this test instead of the build.
template <typename M>
concept ConstructibleLikeKompute = requires(uint32_t family) {
  M(0, {0});
  M(0, {family});
  M(0, {0}, {});
  M(0, {0, 0});
  M(0, {}, {"VK_KHR_shader_float16_int8"});
};

TEST_P(KpTest, ManagerConstructorCallsOfKomputePrograms) {
  // Kompute programs call Manager(0, {0}): a remote constructor taking (std::string, uint32_t)
  // would make that ambiguous (the literal 0 converts to std::string as a null pointer, and {0}
  // to uint32_t), which is why the remote ones take an address alone or a kp::Remote.
  EXPECT_TRUE(ConstructibleLikeKompute<kp::Manager>)
      << "kp::Manager(0, {0}) and kp::Manager(0, {0}, {}) do not compile (ambiguous overloads)";
  auto m = MakeManager(GetParam(), 0, {0});
  auto t = m->tensor({1});
  m->sequence(0)->eval<kp::OpTensorSyncLocal>({t});
  EXPECT_EQ(t->vector(), std::vector<float>{1});
}

// Algorithms take braced tensor lists and default their constants.
TEST_P(KpTest, AlgorithmTakesBracedTensorList) {
  constexpr char kShader[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer A { float a[]; };
    layout(set = 0, binding = 1) buffer B { float b[]; };
    void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] + 0.5; }
  )";
  auto a = mgr().tensor({1, 2});
  auto b = mgr().tensor({0, 0});
  auto algo = mgr().algorithm({a, b}, kp::compileSource(kShader));
  std::vector<std::shared_ptr<kp::Tensor>> params = {a, b};
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(params)
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(params)
      ->eval();
  EXPECT_EQ(b->vector(), (std::vector<float>{1.5f, 2.5f}));
}

}  // namespace
}  // namespace kptest
