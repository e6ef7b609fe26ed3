// The small element types: int8_t, uint8_t, int16_t, uint16_t and kp::float16 tensors, their
// data types, round trips through the device, and OpMult on each.
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>

#include "kp_test.h"
#include "support/half_reference.h"

namespace kptest {
namespace {

using DataType = kp::Tensor::TensorDataTypes;
using MemoryType = kp::Tensor::TensorTypes;
using komputed::test_support::HalfIsNan;
using komputed::test_support::HalfValue;
using komputed::test_support::NearestHalf;

template <typename T>
constexpr DataType kDataType = std::is_same_v<T, int8_t>     ? DataType::eChar
                               : std::is_same_v<T, uint8_t>  ? DataType::eUnsignedChar
                               : std::is_same_v<T, int16_t>  ? DataType::eShort
                               : std::is_same_v<T, uint16_t> ? DataType::eUnsignedShort
                                                             : DataType::eHalf;

template <typename T>
std::string TypeName() {
  if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
  if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
  if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
  if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
  return "kp::float16";
}

// The raw 16 or 8 bits of a value (a float16's bits), to compare values exactly.
template <typename T>
uint32_t Bits(T value) {
  if constexpr (std::is_same_v<T, kp::float16>) {
    return value.bits();
  } else {
    return static_cast<uint32_t>(static_cast<std::make_unsigned_t<T>>(value));
  }
}

template <typename T>
std::vector<uint32_t> AllBits(const std::vector<T>& values) {
  std::vector<uint32_t> bits;
  for (T v : values) bits.push_back(Bits(v));
  return bits;
}

// `count` values of T from every part of its range (every bit pattern, for float16 too).
template <typename T>
std::vector<T> Values(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<T> values(count);
  for (T& v : values) {
    const auto bits = static_cast<uint16_t>(random());
    if constexpr (std::is_same_v<T, kp::float16>) {
      v = kp::float16::fromBits(bits);
    } else {
      v = static_cast<T>(bits);  // the low bits: the type's whole range
    }
  }
  return values;
}

// a × b as the type's own multiply gives it: integers wrap; float16 is the exact product rounded
// to the nearest half (the reference in support/half_reference.h), NaN for NaN.
template <typename T>
uint32_t ProductBits(T a, T b) {
  if constexpr (std::is_same_v<T, kp::float16>) {
    return NearestHalf(HalfValue(a.bits()) * HalfValue(b.bits()));
  } else if constexpr (std::is_signed_v<T>) {
    return Bits(static_cast<T>(static_cast<int32_t>(a) * static_cast<int32_t>(b)));
  } else {
    return Bits(static_cast<T>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b)));
  }
}

template <typename T>
bool SameValue(uint32_t got, uint32_t want) {
  if constexpr (std::is_same_v<T, kp::float16>) {
    if (HalfIsNan(static_cast<uint16_t>(want))) return HalfIsNan(static_cast<uint16_t>(got));
  }
  return got == want;
}

// Creates a tensor of each memory type with host data with `values`, carries the data through the
// device and back (a device copy into a fresh tensor, whose staging copy is cleared before it is
// synced back), and checks the type, sizes and values.
template <typename T>
void RoundTrip(kp::Manager& mgr, const std::vector<T>& values) {
  SCOPED_TRACE(TypeName<T>());
  for (MemoryType memory : {MemoryType::eDevice, MemoryType::eHost, MemoryType::eDeviceAndHost}) {
    SCOPED_TRACE(static_cast<int>(memory));
    auto src = mgr.tensorT<T>(values, memory);
    static_assert(std::is_same_v<decltype(src), std::shared_ptr<kp::TensorT<T>>>);
    EXPECT_EQ(src->dataType(), kDataType<T>);
    EXPECT_EQ(src->Tensor::dataType(), kDataType<T>);
    EXPECT_EQ(src->dataTypeMemorySize(), sizeof(T));
    EXPECT_EQ(src->size(), values.size());
    EXPECT_EQ(src->memorySize(), values.size() * sizeof(T));
    EXPECT_EQ(AllBits(src->vector()), AllBits(values));

    auto dst = mgr.tensorT<T>(values.size(), memory);
    EXPECT_EQ(dst->dataType(), kDataType<T>);
    mgr.sequence()
        ->record<kp::OpTensorSyncDevice>(TensorList{src})
        ->record<kp::OpTensorCopy>(TensorList{src, dst})
        ->eval();
    if (memory == MemoryType::eDevice) {
      // Its host data is a staging copy: what comes back is the device's.
      std::memset(static_cast<void*>(dst->data()), 0, dst->memorySize());
    }
    mgr.sequence()->eval<kp::OpTensorSyncLocal>(TensorList{dst});
    EXPECT_EQ(AllBits(dst->vector()), AllBits(values));
    EXPECT_EQ(AllBits(dst->Tensor::template vector<T>()), AllBits(values));
    EXPECT_EQ(Bits(dst->data()[values.size() - 1]), Bits(values.back()));
    EXPECT_EQ(Bits((*dst)[0]), Bits(values[0]));
  }
}

TEST_P(KpTest, SmallTypeTensorsRoundTripThroughTheDevice) {
  // Odd sizes: tensors of a byte size that is no multiple of 4.
  RoundTrip<int8_t>(mgr(), {-128, -1, 0, 1, 127});
  RoundTrip<uint8_t>(mgr(), {0, 1, 128, 255, 7, 9, 11});
  RoundTrip<int16_t>(mgr(), {-32768, -1, 0, 1, 32767});
  RoundTrip<uint16_t>(mgr(), {0, 1, 32768, 65535, 12345});
  RoundTrip<kp::float16>(mgr(), {kp::float16(1.5f), kp::float16(-0.0f), kp::float16(65504.0f),
                                 kp::float16::fromBits(0x0001), kp::float16::fromBits(0x7C00),
                                 kp::float16::fromBits(0x7E01), kp::float16(-3.14159f)});
  RoundTrip<uint8_t>(mgr(), Values<uint8_t>(100003, 7));  // larger than one chunk of a few bytes
  RoundTrip<kp::float16>(mgr(), Values<kp::float16>(70001, 8));
}

// The raw form takes the small types with their sizes, and only those.
TEST_P(KpTest, RawSmallTypeTensorsCheckTheirElementSize) {
  const int16_t shorts[3] = {-5, 300, 7};
  std::shared_ptr<kp::Tensor> t =
      mgr().tensor(const_cast<int16_t*>(shorts), 3, sizeof(int16_t), DataType::eShort);
  EXPECT_EQ(t->dataType(), DataType::eShort);
  EXPECT_EQ(t->memorySize(), 6u);
  EXPECT_EQ(t->vector<int16_t>(), (std::vector<int16_t>{-5, 300, 7}));
  mgr().sequence()->eval<kp::OpTensorSyncLocal>(TensorList{t});  // the device has the same data
  EXPECT_EQ(t->vector<int16_t>(), (std::vector<int16_t>{-5, 300, 7}));

  auto half = mgr().tensor(nullptr, 4, 2, DataType::eHalf);
  EXPECT_EQ(half->dataType(), DataType::eHalf);
  EXPECT_EQ(half->memorySize(), 8u);
  EXPECT_KP_ERROR(kInvalidArgument, mgr().tensor(nullptr, 4, 4, DataType::eHalf));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().tensor(nullptr, 4, 2, DataType::eChar));
  EXPECT_KP_ERROR(kInvalidArgument, mgr().tensor(nullptr, 4, 1, DataType::eUnsignedShort));
  // A copy between two types of one size is still a type mismatch.
  auto u16 = mgr().tensorT<uint16_t>(size_t{3});
  EXPECT_KP_ERROR(kInvalidArgument, mgr().sequence()->record<kp::OpTensorCopy>(TensorList{t, u16}));
}

// OpMult over `count` elements of T (spread over several rows of workgroups from 65535 × 64
// elements on), every product checked.
template <typename T>
void MultiplyAndCheck(kp::Manager& mgr, size_t count) {
  SCOPED_TRACE(TypeName<T>() + " × " + std::to_string(count));
  const std::vector<T> a = Values<T>(count, 1);
  const std::vector<T> b = Values<T>(count, 2);
  auto ta = mgr.tensorT<T>(a);
  auto tb = mgr.tensorT<T>(b);
  auto tc = mgr.tensorT<T>(count);
  mgr.sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{ta, tb})
      ->record<kp::OpMult>(TensorList{ta, tb, tc}, mgr.algorithm())
      ->record<kp::OpTensorSyncLocal>(TensorList{tc})
      ->eval();
  const std::vector<T> c = tc->vector();
  ASSERT_EQ(c.size(), count);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t want = ProductBits(a[i], b[i]);
    if (!SameValue<T>(Bits(c[i]), want) && wrong++ < 5) {
      ADD_FAILURE() << "element " << i << ": " << std::hex << Bits(a[i]) << " × " << Bits(b[i])
                    << " gave 0x" << Bits(c[i]) << ", want 0x" << want;
    }
  }
  EXPECT_EQ(wrong, 0u);
}

TEST_P(KpTest, OpMultOnSmallTypes) {
  auto i8a = mgr().tensorT<int8_t>({-3, 100, -128, 11});
  auto i8b = mgr().tensorT<int8_t>({5, 3, -1, 11});
  auto i8c = mgr().tensorT<int8_t>(size_t{4});
  auto h_a = mgr().tensorT<kp::float16>({1.5f, -2.0f, 65504.0f, 0.1f});
  auto h_b = mgr().tensorT<kp::float16>({2.0f, 3.0f, 2.0f, 0.1f});
  auto h_c = mgr().tensorT<kp::float16>(size_t{4});
  mgr()
      .sequence()
      ->record<kp::OpTensorSyncDevice>(TensorList{i8a, i8b, h_a, h_b})
      ->record<kp::OpMult>(TensorList{i8a, i8b, i8c}, mgr().algorithm())
      ->record<kp::OpMult>(TensorList{h_a, h_b, h_c}, mgr().algorithm())
      ->record<kp::OpTensorSyncLocal>(TensorList{i8c, h_c})
      ->eval();
  EXPECT_EQ(i8c->vector(), (std::vector<int8_t>{-15, 300 - 256, -128, 121}));
  const std::vector<kp::float16> h = h_c->vector();
  EXPECT_EQ(static_cast<float>(h[0]), 3.0f);
  EXPECT_EQ(static_cast<float>(h[1]), -6.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(h[2])));
  // 0.1 is 0x2E66 as a half (0.0999755859375); its square, 0.0099951..., rounds to 0x211E.
  EXPECT_EQ(h_a->vector()[3].bits(), 0x2E66);
  EXPECT_EQ(h[3].bits(), 0x211E);
}

// Over 65535 elements (past one row of workgroups on any device, past 65535 × 64 into a second
// row), every element of every type checked.
TEST_P(KpTest, OpMultOnSmallTypesAtLargeSizes) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t count : {size_t{65537}, size_t{65535} * 64 + 1001}) {
    MultiplyAndCheck<int8_t>(mgr(), count);
    MultiplyAndCheck<uint8_t>(mgr(), count);
    MultiplyAndCheck<int16_t>(mgr(), count);
    MultiplyAndCheck<uint16_t>(mgr(), count);
    MultiplyAndCheck<kp::float16>(mgr(), count);
  }
  const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
  RecordProperty("ms", std::to_string(took.count()));
}

TEST_P(KpTest, OpMultRejectsMixedSmallTypes) {
  auto a = mgr().tensorT<int16_t>({1, 2});
  auto b = mgr().tensorT<uint16_t>({3, 4});
  auto c = mgr().tensorT<int16_t>(size_t{2});
  auto h = mgr().tensorT<kp::float16>(size_t{2});
  auto seq = mgr().sequence();
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMult>(TensorList{a, b, c}, mgr().algorithm()));
  EXPECT_KP_ERROR(kInvalidArgument,
                  seq->record<kp::OpMult>(TensorList{a, c, h}, mgr().algorithm()));
}

// The host conversion of kp::float16, against the reference: every half to float and back, and
// floats from every part of float's range (boundaries, ties, subnormals, overflow) to half.
TEST(Float16, ConvertsToTheNearestHalf) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = kp::float16::fromBits(static_cast<uint16_t>(bits));
    const float f = h;
    if (HalfIsNan(static_cast<uint16_t>(bits))) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      EXPECT_TRUE(HalfIsNan(kp::float16(f).bits())) << bits;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(bits))) << bits;
    ASSERT_EQ(kp::float16(f).bits(), bits) << f;
    ASSERT_EQ(std::signbit(f), (bits & 0x8000) != 0) << bits;
  }
  const float boundaries[] = {0.0f,          -0.0f,         1.0f,         65504.0f,     65519.996f,
                              65520.0f,      -65520.0f,     1e30f,        INFINITY,     -INFINITY,
                              5.9604645e-8f, 2.9802322e-8f, 2.980233e-8f, 8.940697e-8f, 1e-45f,
                              6.1035156e-5f, 6.1031434e-5f, 1.0009766f,   1.0004883f,   1.0014648f,
                              2049.0f,       2051.0f,       -0.33333334f};
  for (float f : boundaries) {
    EXPECT_EQ(kp::float16(f).bits(), NearestHalf(f)) << f;
  }
  std::mt19937 random(16);
  uint32_t checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    // Floats around the half range (exponents 2^-30 to 2^17), and any float at all.
    uint32_t x = static_cast<uint32_t>(random());
    if (i % 2 == 0) x = (x & 0x807FFFFFu) | ((97u + (x >> 23) % 48u) << 23);
    float f;
    std::memcpy(&f, &x, sizeof(f));
    const uint16_t want = NearestHalf(f);
    const uint16_t got = kp::float16(f).bits();
    if (HalfIsNan(want)) {
      EXPECT_TRUE(HalfIsNan(got)) << f;
    } else if (got != want) {
      ADD_FAILURE() << "float bits 0x" << std::hex << x << ": 0x" << got << ", want 0x" << want;
      if (++checked > 10) break;
    }
  }
  // Arithmetic and comparisons go through float.
  const kp::float16 h = 1.5f;
  EXPECT_EQ(h * 2.0f, 3.0f);
  EXPECT_EQ(h, 1.5f);
  EXPECT_EQ(kp::float16(0.1f) * kp::float16(0.1f), 0.0999755859375f * 0.0999755859375f);
  EXPECT_EQ(kp::float16().bits(), 0u);
  EXPECT_EQ(std::vector<kp::float16>(3)[2].bits(), 0u);
}

}  // namespace
}  // namespace kptest
