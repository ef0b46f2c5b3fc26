// What CUDA's headers give a kernel and plain C++ lacks, for host compilers: qualifiers as
// plain C++, bit casts, rsqrt, float4, and the half types with IEEE round-to-nearest-even
// conversions. Included by the CUDA emulation (host_emul.h) and by the CPU target's runtime
// (runtime_cpu.h), so both compile generated code with one definition of each.
#pragma once

#include <cmath>
#include <cstring>

using std::isinf;
using std::isnan;

#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
#ifndef __restrict__
#define __restrict__ __restrict
#endif

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

// -- half types (the bits, with IEEE round-to-nearest-even conversions) ----------------------
struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};

inline float __half2float(__half h) {
  unsigned sign = (unsigned)(h.x & 0x8000u) << 16, mant = h.x & 0x3ffu, bits;
  int exp = (h.x >> 10) & 0x1f;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | ((unsigned)(exp - 15 + 127) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((unsigned)(exp - 15 + 127) << 23) | (mant << 13);
  }
  return __int_as_float((int)bits);
}

inline __half __float2half_rn(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned sign = (x >> 16) & 0x8000u;
  unsigned mant = x & 0x7fffffu;
  const int exp = (int)((x >> 23) & 0xffu);
  unsigned h;
  if (exp == 255) {
    h = sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u);
  } else {
    const int e = exp - 127 + 15;
    if (e >= 31) {
      h = sign | 0x7c00u;
    } else if (e <= 0) {
      if (e < -10) {
        h = sign;
      } else {
        mant |= 0x800000u;
        const int shift = 14 - e;
        unsigned hm = mant >> shift;
        const unsigned rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (hm & 1u))) ++hm;
        h = sign | hm;
      }
    } else {
      h = sign | ((unsigned)e << 10) | (mant >> 13);
      const unsigned rem = mant & 0x1fffu;
      if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rounds up the exponent
    }
  }
  __half r;
  r.x = (unsigned short)h;
  return r;
}

inline float __bfloat162float(__nv_bfloat16 b) {
  const unsigned bits = (unsigned)b.x << 16;
  return __int_as_float((int)bits);
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const unsigned x = __float_as_uint(f);
  __nv_bfloat16 r;
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) {
    r.x = (unsigned short)((x >> 16) | 0x40u);  // a quiet NaN
  } else {
    r.x = (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  return r;
}

