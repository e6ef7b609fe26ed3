// Tensors at every size: the same cases with a few elements and with more than the 4 MiB that one
// remote message carries (the remote backend streams such data in chunks), so that the backends
// agree below and above that limit.
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kp_test.h"

namespace kptest {
namespace {

using MemoryType = kp::Tensor::TensorTypes;

// Element counts: a few, and 8 MiB of 32-bit elements plus a few (not a multiple of a chunk).
constexpr size_t kSmall = 5;
constexpr size_t kLarge = (size_t{8} << 20) / 4 + 3;

// out[i] = in[i] * 2 + 1, for any element count (64 invocations per workgroup).
constexpr char kTwicePlusOne[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0) buffer In { uint in_v[]; };
  layout(set = 0, binding = 1) buffer Out { uint out_v[]; };
  void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < out_v.length()) out_v[i] = in_v[i] * 2u + 1u;
  }
)";

kp::Workgroup Groups(size_t count) { return {static_cast<uint32_t>((count + 63) / 64), 1, 1}; }

std::vector<uint32_t> Pattern(size_t count, uint32_t seed) {
  std::vector<uint32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<uint32_t>(i) * 2654435761u + seed;
  return v;
}

// Reads a tensor of any memory type: storage tensors are first copied into a device tensor.
std::vector<uint32_t> ReadBack(kp::Manager& mgr, const std::shared_ptr<kp::TensorT<uint32_t>>& t) {
  std::shared_ptr<kp::TensorT<uint32_t>> readable = t;
  if (t->memoryType() == MemoryType::eStorage) {
    readable = mgr.tensorT<uint32_t>(t->size());
    mgr.sequence()->eval<kp::OpTensorCopy>(TensorList{t, readable});
  }
  mgr.sequence()->eval<kp::OpTensorSyncLocal>(TensorList{readable});
  return readable->vector();
}

// How many elements differ, and the first that does: one line instead of millions.
::testing::AssertionResult SameValues(const std::vector<uint32_t>& got,
                                      const std::vector<uint32_t>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << want.size();
  }
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && wrong++ == 0) first = i;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << got.size() << " elements differ; the first at " << first << ": "
         << got[first] << ", expected " << want[first];
}

class KpSizeTest : public ::testing::TestWithParam<std::tuple<BackendKind, size_t>> {
 protected:
  void SetUp() override { mgr_ = MakeManager(std::get<0>(GetParam())); }
  void TearDown() override { mgr_.reset(); }
  kp::Manager& mgr() { return *mgr_; }
  size_t count() const { return std::get<1>(GetParam()); }

  std::unique_ptr<kp::Manager> mgr_;
};

// Initial data reaches the device, for every memory type (a storage tensor's included), and
// sync operations move data both ways.
TEST_P(KpSizeTest, InitialDataOfEveryMemoryType) {
  const std::vector<uint32_t> data = Pattern(count(), 1);
  for (MemoryType type : kAllMemoryTypes) {
    SCOPED_TRACE(MemoryName(type));
    auto t = mgr().tensorT<uint32_t>(data, type);
    EXPECT_EQ(t->size(), count());
    if (type != MemoryType::eStorage) {
      EXPECT_TRUE(SameValues(t->vector(), data));
    }
    EXPECT_TRUE(SameValues(ReadBack(mgr(), t), data));
  }
}

// The brief's case: a storage tensor made with 8 MiB of initial data, used by a shader.
TEST_P(KpSizeTest, StorageTensorWithInitialDataFeedsAShader) {
  const std::vector<uint32_t> data = Pattern(count(), 7);
  auto in = mgr().tensorT<uint32_t>(data, MemoryType::eStorage);
  auto out = mgr().tensorT<uint32_t>(count());
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTwicePlusOne), Groups(count()));
  mgr()
      .sequence()
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  std::vector<uint32_t> want(data.size());
  for (size_t i = 0; i < data.size(); ++i) want[i] = data[i] * 2u + 1u;
  EXPECT_TRUE(SameValues(out->vector(), want));
}

// A device tensor's host data moves only through sync operations, both ways.
TEST_P(KpSizeTest, DeviceTensorsMoveDataThroughSyncOps) {
  auto in = mgr().tensorT<uint32_t>(Pattern(count(), 3));
  auto out = mgr().tensorT<uint32_t>(count());
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kTwicePlusOne), Groups(count()));
  const std::vector<uint32_t> next = Pattern(count(), 11);
  in->setData(next);
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{in})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  std::vector<uint32_t> want(next.size());
  for (size_t i = 0; i < next.size(); ++i) want[i] = next[i] * 2u + 1u;
  EXPECT_TRUE(SameValues(out->vector(), want));
  EXPECT_TRUE(SameValues(in->vector(), next));
}

// Host tensors need no sync operations: host writes reach the shader, results come back.
TEST_P(KpSizeTest, HostTensorsNeedNoSyncOps) {
  for (MemoryType type : {MemoryType::eHost, MemoryType::eDeviceAndHost}) {
    SCOPED_TRACE(MemoryName(type));
    auto in = mgr().tensorT<uint32_t>(Pattern(count(), 5), type);
    auto out = mgr().tensorT<uint32_t>(count(), type);
    auto algo = mgr().algorithm({in, out}, kp::compileSource(kTwicePlusOne), Groups(count()));
    const std::vector<uint32_t> next = Pattern(count(), 9);
    in->setData(next);
    mgr().sequence()->eval<kp::OpAlgoDispatch>(algo);
    std::vector<uint32_t> want(next.size());
    for (size_t i = 0; i < next.size(); ++i) want[i] = next[i] * 2u + 1u;
    EXPECT_TRUE(SameValues(out->vector(), want));
  }
}

// Copies between every pair of memory types carry the data, on the device and in host copies.
TEST_P(KpSizeTest, CopyBetweenEveryPairOfMemoryTypes) {
  const std::vector<uint32_t> data = Pattern(count(), 13);
  for (MemoryType from : kAllMemoryTypes) {
    for (MemoryType to : kAllMemoryTypes) {
      SCOPED_TRACE(MemoryName(from) + " -> " + MemoryName(to));
      auto src = mgr().tensorT<uint32_t>(data, from);
      auto dst = mgr().tensorT<uint32_t>(count(), to);
      mgr().sequence()->eval<kp::OpTensorCopy>(TensorList{src, dst});
      if (from != MemoryType::eStorage && to != MemoryType::eStorage) {
        EXPECT_TRUE(SameValues(dst->vector(), data));  // current without a sync op
      }
      EXPECT_TRUE(SameValues(ReadBack(mgr(), dst), data));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BackendsAndSizes, KpSizeTest,
                         ::testing::Combine(::testing::Values(BackendKind::kInProcess,
                                                              BackendKind::kRemote,
                                                              BackendKind::kSameHost),
                                            ::testing::Values(kSmall, kLarge)),
                         [](const ::testing::TestParamInfo<std::tuple<BackendKind, size_t>>& info) {
                           return Name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == kSmall ? "_Small" : "_Over4MiB");
                         });

}  // namespace
}  // namespace kptest
