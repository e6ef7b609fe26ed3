// Tensors: element and memory types, host data, sync and copy operations.
#include <cstring>
#include <numeric>

#include "kp_test.h"

namespace kptest {
namespace {

using MemoryType = kp::Tensor::TensorTypes;
using DataType = kp::Tensor::TensorDataTypes;

// out[i] = in[i] * 2.0 (float).
constexpr char kDoubleShader[] = R"(
  #version 450
  layout(local_size_x = 1) in;
  layout(set = 0, binding = 0) buffer In { float in_v[]; };
  layout(set = 0, binding = 1) buffer Out { float out_v[]; };
  void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = in_v[i] * 2.0; }
)";

// Reads a tensor of any memory type: storage tensors are first copied into a device tensor.
std::vector<float> ReadBack(kp::Manager& mgr, const std::shared_ptr<kp::TensorT<float>>& t) {
  std::shared_ptr<kp::TensorT<float>> readable = t;
  if (t->memoryType() == MemoryType::eStorage) {
    readable = mgr.tensorT<float>(t->size());
    mgr.sequence()->eval<kp::OpTensorCopy>(TensorList{t, readable});
  }
  mgr.sequence()->eval<kp::OpTensorSyncLocal>(TensorList{readable});
  return readable->vector();
}

TEST_P(KpTest, TensorTypesFollowTheTemplateArgument) {
  auto f = mgr().tensor({1.5f, 2.5f});
  static_assert(std::is_same_v<decltype(f), std::shared_ptr<kp::TensorT<float>>>);
  EXPECT_EQ(f->dataType(), DataType::eFloat);
  EXPECT_EQ(f->size(), 2u);
  EXPECT_EQ(f->dataTypeMemorySize(), 4u);
  EXPECT_EQ(f->memorySize(), 8u);
  EXPECT_EQ(f->tensorType(), MemoryType::eDevice);
  EXPECT_TRUE(f->isInit());

  auto i = mgr().tensorT<int32_t>({-1, 2, -3}, MemoryType::eHost);
  EXPECT_EQ(i->dataType(), DataType::eInt);
  EXPECT_EQ(i->memoryType(), MemoryType::eHost);
  EXPECT_EQ(i->vector(), (std::vector<int32_t>{-1, 2, -3}));

  auto u = mgr().tensorT<uint32_t>(std::vector<uint32_t>{4000000000u});
  EXPECT_EQ(u->dataType(), DataType::eUnsignedInt);
  EXPECT_EQ(u->vector(), std::vector<uint32_t>{4000000000u});

  auto d = mgr().tensorT<double>({1.0000000001, -2.0});
  EXPECT_EQ(d->dataType(), DataType::eDouble);
  EXPECT_EQ(d->dataTypeMemorySize(), 8u);
  EXPECT_EQ(d->vector(), (std::vector<double>{1.0000000001, -2.0}));
  // The untyped view reads the same bytes.
  EXPECT_EQ(d->Tensor::vector<double>(), (std::vector<double>{1.0000000001, -2.0}));
  EXPECT_EQ((*f)[1], 2.5f);
}

TEST_P(KpTest, ReservedTensorsAreZeros) {
  for (MemoryType type : kAllMemoryTypes) {
    SCOPED_TRACE(MemoryName(type));
    auto t = mgr().tensorT<float>(size_t{6}, type);
    EXPECT_EQ(t->size(), 6u);
    if (type != MemoryType::eStorage) {
      EXPECT_EQ(t->vector(), std::vector<float>(6, 0.0f));
    }
    // On the device too.
    EXPECT_EQ(ReadBack(mgr(), t), std::vector<float>(6, 0.0f));
  }
}

TEST_P(KpTest, SetDataReplacesHostDataOfTheSameSize) {
  auto t = mgr().tensor({1, 2, 3});
  EXPECT_KP_ERROR(kInvalidArgument, t->setData({1, 2}));
  EXPECT_KP_ERROR(kInvalidArgument, t->setData({1, 2, 3, 4}));
  EXPECT_EQ(t->vector(), (std::vector<float>{1, 2, 3}));

  t->setData({4, 5, 6});
  EXPECT_EQ(t->vector(), (std::vector<float>{4, 5, 6}));
  mgr().sequence()->eval<kp::OpTensorSyncDevice>(TensorList{t});
  t->setData({0, 0, 0});
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{t});
  EXPECT_EQ(t->vector(), (std::vector<float>{4, 5, 6}));

  const float raw[3] = {7, 8, 9};
  t->setRawData(raw);
  EXPECT_EQ(t->vector(), (std::vector<float>{7, 8, 9}));
}

TEST_P(KpTest, BoolTensorRoundTripsThroughTheDevice) {
  auto src = mgr().tensorT<bool>({true, false, true, true, false});
  EXPECT_EQ(src->dataType(), DataType::eBool);
  EXPECT_EQ(src->dataTypeMemorySize(), 1u);
  EXPECT_EQ(src->memorySize(), 5u);
  EXPECT_EQ(src->vector(), (std::vector<bool>{true, false, true, true, false}));

  auto dst = mgr().tensorT<bool>(size_t{5});
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{src})
      ->record<kp::OpTensorCopy>(TensorList{src, dst})
      ->eval();
  dst->setData({false, false, false, false, false});  // only the device copy holds the data now
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{dst});
  EXPECT_EQ(dst->vector(), (std::vector<bool>{true, false, true, true, false}));
}

TEST_P(KpTest, RawTensorCopiesCallerDataAndRoundTrips) {
  float data[4] = {1.5f, -2.0f, 3.25f, 8.0f};
  std::shared_ptr<kp::Tensor> t = mgr().tensor(data, 4, sizeof(float), DataType::eFloat);
  data[0] = 100.0f;  // the tensor holds its own copy
  EXPECT_EQ(t->size(), 4u);
  EXPECT_EQ(t->dataTypeMemorySize(), sizeof(float));
  EXPECT_EQ(t->memorySize(), 4 * sizeof(float));
  EXPECT_EQ(t->dataType(), DataType::eFloat);
  EXPECT_EQ(t->vector<float>(), (std::vector<float>{1.5f, -2.0f, 3.25f, 8.0f}));
  EXPECT_EQ(t->data<float>()[3], 8.0f);

  auto out = mgr().tensor(nullptr, 4, sizeof(float), DataType::eFloat);
  EXPECT_EQ(out->vector<float>(), std::vector<float>(4, 0.0f));
  auto algo = mgr().algorithm({t, out}, kp::compileSource(kDoubleShader));
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{t})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector<float>(), (std::vector<float>{3.0f, -4.0f, 6.5f, 16.0f}));
}

TEST_P(KpTest, CustomElementTensorRoundTrips) {
  struct Item {
    float a;
    uint32_t b;
    int32_t c;
  };
  Item items[2] = {{1.5f, 3000000000u, -7}, {-0.5f, 1u, 123456}};
  auto src = mgr().tensor(items, 2, sizeof(Item), DataType::eCustom);
  auto dst = mgr().tensor(nullptr, 2, sizeof(Item), DataType::eCustom);
  EXPECT_EQ(src->dataType(), DataType::eCustom);
  EXPECT_EQ(src->memorySize(), sizeof(items));
  mgr()
      .sequence()
      ->record<kp::OpTensorCopy>(TensorList{src, dst})
      ->record<kp::OpTensorSyncLocal>(TensorList{dst})
      ->eval();
  Item back[2];
  std::memcpy(back, dst->rawData(), sizeof(back));
  EXPECT_EQ(back[0].a, 1.5f);
  EXPECT_EQ(back[0].b, 3000000000u);
  EXPECT_EQ(back[0].c, -7);
  EXPECT_EQ(back[1].a, -0.5f);
  EXPECT_EQ(back[1].b, 1u);
  EXPECT_EQ(back[1].c, 123456);
}

// A device tensor's host data changes only through sync operations.
TEST_P(KpTest, DeviceTensorsMoveDataOnlyThroughSyncOps) {
  auto in = mgr().tensor({1, 2, 3});
  auto out = mgr().tensor({0, 0, 0});
  auto algo = mgr().algorithm({in, out}, kp::compileSource(kDoubleShader));

  in->setData({10, 20, 30});  // not synced: the shader still sees {1, 2, 3}
  mgr().sequence()->eval<kp::OpAlgoDispatch>(algo);
  EXPECT_EQ(out->vector(), (std::vector<float>{0, 0, 0}));  // not synced back yet
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{out});
  EXPECT_EQ(out->vector(), (std::vector<float>{2, 4, 6}));

  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{in})
      ->record<kp::OpAlgoDispatch>(algo)
      ->record<kp::OpTensorSyncLocal>(TensorList{out})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{20, 40, 60}));
}

// Host tensors are read by shaders directly: host writes need no sync, results appear at once.
TEST_P(KpTest, HostTensorsNeedNoSyncOps) {
  for (MemoryType type : {MemoryType::eHost, MemoryType::eDeviceAndHost}) {
    SCOPED_TRACE(MemoryName(type));
    auto in = mgr().tensor({1, 2, 3}, type);
    auto out = mgr().tensor({0, 0, 0}, type);
    auto algo = mgr().algorithm({in, out}, kp::compileSource(kDoubleShader));
    in->data()[1] = 50;
    auto seq = mgr().sequence();
    seq->eval<kp::OpAlgoDispatch>(algo);
    EXPECT_EQ(out->vector(), (std::vector<float>{2, 100, 6}));
    in->setData({-1, -2, -3});
    seq->eval();  // the same recorded dispatch sees the new host data
    EXPECT_EQ(out->vector(), (std::vector<float>{-2, -4, -6}));
  }
}

TEST_P(KpTest, CopyBetweenEveryPairOfMemoryTypes) {
  const std::vector<float> data = {1, -2, 3.5f, 4e6f, -5e-3f};
  const std::vector<float> zeros(data.size(), 0.0f);
  for (MemoryType from : kAllMemoryTypes) {
    for (MemoryType to : kAllMemoryTypes) {
      SCOPED_TRACE(MemoryName(from) + " -> " + MemoryName(to));
      auto src = mgr().tensor(data, from);
      auto dst = mgr().tensor(zeros, to);
      mgr().sequence()->eval<kp::OpTensorCopy>(TensorList{src, dst});
      if (from != MemoryType::eStorage && to != MemoryType::eStorage) {
        // The host copy is current without a sync op.
        EXPECT_EQ(dst->vector(), data);
      }
      EXPECT_EQ(ReadBack(mgr(), dst), data);
      if (from != MemoryType::eStorage) {
        EXPECT_EQ(src->vector(), data);
      }
    }
  }
}

TEST_P(KpTest, CopyFillsEveryDestination) {
  auto src = mgr().tensorT<uint32_t>({7, 8, 9});
  auto d1 = mgr().tensorT<uint32_t>(size_t{3});
  auto d2 = mgr().tensorT<uint32_t>(size_t{3}, MemoryType::eHost);
  auto d3 = mgr().tensorT<uint32_t>(size_t{3}, MemoryType::eStorage);
  auto d4 = mgr().tensorT<uint32_t>(size_t{3});
  mgr()
      .sequence()
      ->record<kp::OpTensorCopy>(TensorList{src, d1, d2, d3})
      ->record<kp::OpTensorCopy>(TensorList{d3, d4})
      ->record<kp::OpTensorSyncLocal>(TensorList{d4})
      ->eval();
  EXPECT_EQ(d1->vector(), (std::vector<uint32_t>{7, 8, 9}));
  EXPECT_EQ(d2->vector(), (std::vector<uint32_t>{7, 8, 9}));
  EXPECT_EQ(d4->vector(), (std::vector<uint32_t>{7, 8, 9}));
}

TEST_P(KpTest, LaterOpNamesAreAliases) {
  auto a = mgr().tensor({1, 2, 3});
  auto b = mgr().tensor({0, 0, 0});
  a->setData({4, 5, 6});
  auto seq = mgr().sequence();
  seq->record<kp::OpSyncDevice>(TensorList{a})
      ->record<kp::OpCopy>(TensorList{a, b})
      ->record<kp::OpMemoryBarrier>(
          TensorList{b}, vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eTransferRead,
          vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eTransfer)
      ->record<kp::OpSyncLocal>(TensorList{b})
      ->record<kp::OpMemoryBarrier>(TensorList{b}, vk::AccessFlagBits::eTransferWrite,
                                    vk::AccessFlagBits::eHostRead,
                                    vk::PipelineStageFlagBits::eTransfer,
                                    vk::PipelineStageFlagBits::eHost, /*barrierOnPrimary=*/false)
      ->eval();
  EXPECT_EQ(b->vector(), (std::vector<float>{4, 5, 6}));
}

TEST_P(KpTest, CopyRejectsBadTensorLists) {
  auto seq = mgr().sequence();
  auto f3 = mgr().tensor({1, 2, 3});
  auto f4 = mgr().tensor({1, 2, 3, 4});
  auto u3 = mgr().tensorT<uint32_t>({1, 2, 3});
  auto i3 = mgr().tensorT<int32_t>({1, 2, 3});
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{f3}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{f3, u3}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{u3, i3}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{f3, f4}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{f4, f3}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->eval<kp::OpTensorCopy>(TensorList{f3, f3, f4}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorSyncDevice>(TensorList{}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorSyncLocal>(TensorList{}));
  // The sequence still works.
  seq->eval<kp::OpTensorCopy>(TensorList{f3, mgr().tensor({0, 0, 0})});
}

// A copy onto its own source is refused when it is recorded, on every backend, and nothing of that
// record applies: the sequence evaluates what was recorded before it.
TEST_P(KpTest, CopyOntoItsOwnSourceIsRejectedAtRecord) {
  auto src = mgr().tensor({1, 2, 3});
  auto dst = mgr().tensor({0, 0, 0});
  auto untouched = mgr().tensor({0, 0, 0});
  auto seq = mgr().sequence();
  seq->record<kp::OpTensorCopy>(TensorList{src, dst});
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{src, src}));
  EXPECT_KP_ERROR(kInvalidArgument, seq->record<kp::OpTensorCopy>(TensorList{src, untouched, src}));
  EXPECT_TRUE(seq->isRecording());
  seq->eval();
  EXPECT_EQ(dst->vector(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(untouched->vector(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ReadBack(mgr(), dst), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ReadBack(mgr(), untouched), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(ReadBack(mgr(), src), (std::vector<float>{1, 2, 3}));
}

// The kp contract: eStorage has no host data, even where device-local memory is also host
// visible (lavapipe, integrated GPUs, resizable BAR) and the buffer could be mapped.
TEST_P(KpTest, StorageTensorsHaveNoHostData) {
  auto storage = mgr().tensorT<float>(size_t{4}, MemoryType::eStorage);
  auto with_data = mgr().tensor({1, 2, 3, 4}, MemoryType::eStorage);
  for (const auto& t : {storage, with_data}) {
    EXPECT_EQ(t->rawData(), nullptr);
    EXPECT_EQ(t->data(), nullptr);
    EXPECT_KP_ERROR(kFailedPrecondition, t->vector());
    EXPECT_KP_ERROR(kFailedPrecondition, t->setData({1, 2, 3, 4}));
  }
  EXPECT_EQ(ReadBack(mgr(), with_data), (std::vector<float>{1, 2, 3, 4}));
}

// Storage tensors live only on the device: algorithms write and read them, copies bring them out.
TEST_P(KpTest, StorageTensorsCarryDataBetweenDispatches) {
  constexpr char kTriple[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer In { float in_v[]; };
    layout(set = 0, binding = 1) buffer Mid { float mid[]; };
    void main() { uint i = gl_GlobalInvocationID.x; mid[i] = in_v[i] * 3.0; }
  )";
  constexpr char kAddOne[] = R"(
    #version 450
    layout(local_size_x = 1) in;
    layout(set = 0, binding = 0) buffer Mid { float mid[]; };
    layout(set = 0, binding = 1) buffer Out { float out_v[]; };
    void main() { uint i = gl_GlobalInvocationID.x; out_v[i] = mid[i] + 1.0; }
  )";
  auto in = mgr().tensor({1, 2, 3, 4});
  auto mid = mgr().tensorT<float>(size_t{4}, MemoryType::eStorage);
  auto out = mgr().tensor({0, 0, 0, 0});
  auto copy = mgr().tensor({0, 0, 0, 0});

  auto triple = mgr().algorithm({in, mid}, kp::compileSource(kTriple));
  auto add_one = mgr().algorithm({mid, out}, kp::compileSource(kAddOne));
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{in, mid})  // a no-op for the storage tensor
      ->record<kp::OpAlgoDispatch>(triple)
      ->record<kp::OpMemoryBarrier>(
          TensorList{mid}, vk::AccessFlagBits::eShaderWrite, vk::AccessFlagBits::eShaderRead,
          vk::PipelineStageFlagBits::eComputeShader, vk::PipelineStageFlagBits::eComputeShader)
      ->record<kp::OpAlgoDispatch>(add_one)
      ->record<kp::OpTensorCopy>(TensorList{mid, copy})
      ->record<kp::OpTensorSyncLocal>(TensorList{out, mid, copy})
      ->eval();
  EXPECT_EQ(out->vector(), (std::vector<float>{4, 7, 10, 13}));
  EXPECT_EQ(copy->vector(), (std::vector<float>{3, 6, 9, 12}));
}

}  // namespace
}  // namespace kptest
