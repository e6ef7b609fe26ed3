#version 450
// Built-in element-wise multiply: c[i] = a[i] * b[i]. Defined at build time:
//  ELEMENT  the type of the tensors' elements in the shader;
//  WIDE     the type the product is computed in: ELEMENT itself for the 32- and 64-bit types, the
//           32-bit int or uint for the 8- and 16-bit integers (the product is the wide one's low
//           bits, as a multiply of ELEMENTs wraps), float for float16;
//  STORAGE_8BIT / STORAGE_16BIT  the 8- or 16-bit elements are loaded and stored only (the
//           storageBuffer8BitAccess / storageBuffer16BitAccess features), never computed on, so
//           that the arithmetic types (shaderInt8, shaderInt16, shaderFloat16) are not needed;
//  HALF     ELEMENT is uint16_t holding IEEE 754 binary16 bits, converted here with integer
//           operations: exactly, and rounded to nearest-even on every device.
// Dispatched as a grid of workgroups of 256 invocations (MultiplyWorkgroup in shader.h), with up to
// 65535 workgroups per dimension: invocation i is numbered row by row (x fastest, then y, then
// z), and those at or past c's length do nothing.
#if defined(STORAGE_8BIT)
#extension GL_EXT_shader_8bit_storage : require
#endif
#if defined(STORAGE_16BIT)
#extension GL_EXT_shader_16bit_storage : require
#endif
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer A { ELEMENT a[]; };
layout(set = 0, binding = 1) readonly buffer B { ELEMENT b[]; };
layout(set = 0, binding = 2) writeonly buffer C { ELEMENT c[]; };

#if defined(HALF)
// binary16 bits -> float, exactly (subnormal halves are normal floats).
float HalfToFloat(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint exponent = (h >> 10) & 0x1Fu;
  uint mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return uintBitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0u) {
    if (mantissa == 0u) return uintBitsToFloat(sign);
    // mantissa * 2^-24 = 1.f * 2^(msb - 24)
    int msb = findMSB(mantissa);
    uint fraction = (mantissa << uint(23 - msb)) & 0x7FFFFFu;
    return uintBitsToFloat(sign | (uint(msb - 24 + 127) << 23) | fraction);
  }
  return uintBitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// float -> binary16 bits, rounded to nearest, ties to even; NaN stays NaN (quiet).
uint FloatToHalf(float value) {
  uint x = floatBitsToUint(value);
  uint sign = (x >> 16) & 0x8000u;
  uint exponent = (x >> 23) & 0xFFu;
  uint mantissa = x & 0x7FFFFFu;
  if (exponent == 0xFFu) {
    return sign | 0x7C00u | (mantissa != 0u ? 0x200u | (mantissa >> 13) : 0u);
  }
  int e = int(exponent) - 112;  // the binary16 exponent field
  if (e >= 31) return sign | 0x7C00u;
  uint full = mantissa | (exponent != 0u ? 0x800000u : 0u);
  // A normal half keeps the top 10 fraction bits; a subnormal one (e <= 0) full >> (14 - e).
  int shift = e > 0 ? 13 : 14 - e;
  if (shift > 24) return sign;  // below half of the least subnormal: zero
  uint kept = e > 0 ? (uint(e) << 10) | (mantissa >> 13) : full >> uint(shift);
  uint rest = full & ((1u << uint(shift)) - 1u);
  uint halfway = 1u << uint(shift - 1);
  // Rounding up may carry into the exponent, up to infinity (0x7C00): still the right bits.
  if (rest > halfway || (rest == halfway && (kept & 1u) != 0u)) kept += 1u;
  return sign | kept;
}
#define WIDEN(value) HalfToFloat(uint(value))
#define NARROW(value) ELEMENT(FloatToHalf(value))
#else
// (8- and 16-bit values cannot be function arguments without the arithmetic types.)
#define WIDEN(value) WIDE(value)
#define NARROW(value) ELEMENT(value)
#endif

void main() {
  uint row = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint i = gl_GlobalInvocationID.x +
           row * (gl_GlobalInvocationID.y + gl_NumWorkGroups.y * gl_GlobalInvocationID.z);
  if (i >= uint(c.length())) return;
  c[i] = NARROW(WIDEN(a[i]) * WIDEN(b[i]));
}
