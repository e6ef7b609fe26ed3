#pragma once
// A reference for IEEE 754 binary16 ("half") values that tests check conversions and products
// against, written from the format's definition rather than with bit manipulation: a half's value
// from its fields, and rounding as a search among every finite half for the nearest one.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace komputed::test_support {

// The value of the half with bits `bits` (sign, 5 exponent bits biased by 15, 10 fraction bits):
// infinities and NaN included.
inline double HalfValue(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1F;
  const int fraction = bits & 0x3FF;
  if (exponent == 0x1F) return fraction == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(fraction, -24);  // subnormal: fraction × 2^-24
  return sign * std::ldexp(1024 + fraction, exponent - 25);    // 1.fraction × 2^(exponent-15)
}

inline bool HalfIsNan(uint16_t bits) { return (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0; }

// The half nearest to `x`, ties to the one with an even last bit; past the largest finite half
// (65504) by half of its spacing (65520 and above) it is infinity. NaN gives 0x7E00.
inline uint16_t NearestHalf(double x) {
  if (std::isnan(x)) return 0x7E00;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  // The non-negative finite halves, 0x0000 to 0x7BFF, increase with their bits.
  static const std::array<double, 0x7C00> kValues = [] {
    std::array<double, 0x7C00> values{};
    for (uint32_t b = 0; b < values.size(); ++b) values[b] = HalfValue(static_cast<uint16_t>(b));
    return values;
  }();
  // Candidates: the largest half at or below a, and the next one up (infinity, 0x7C00, plays the
  // part of 65536 above 65504: it is the even one of that pair).
  const auto above = std::upper_bound(kValues.begin(), kValues.end(), a);
  const uint32_t low = static_cast<uint32_t>(above - kValues.begin()) - 1;
  const uint32_t high = low + 1;
  const double low_value = kValues[low];
  const double high_value = high < kValues.size() ? kValues[high] : 65536.0;
  const double to_low = a - low_value;
  const double to_high = high_value - a;
  uint32_t nearest = to_low < to_high ? low : to_high < to_low ? high : (low % 2 == 0 ? low : high);
  return static_cast<uint16_t>(sign | nearest);
}

}  // namespace komputed::test_support
