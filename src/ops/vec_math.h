// vec_math.h: internal to src/ops/*_cpu.cpp. Branchless fp32 math that the compiler can vectorize, and the
// "one body, two targets" pattern for run-time dispatch without a global -march:
//
//   K3_OPS_INLINE void body(...) { plain loops }
//   void rows_portable(...) { body(...); }                  // baseline ISA
//   K3_OPS_AVX512 void rows_avx512(...) { body(...); }      // the same loops vectorized for AVX-512
//
// exp_fast: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6 polynomial (rel. error ~2e-7), 2^n by building
// the exponent bits (no float->int conversion, so NaN stays NaN and nothing is undefined); x < -87.3 gives
// +0, x > 88.7 gives +inf. sigmoid_fast and tanh_fast are built on it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#define K3_OPS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define K3_OPS_HAVE_AVX512 1
#else
#define K3_OPS_AVX512
#define K3_OPS_HAVE_AVX512 0
#endif
#define K3_OPS_INLINE __attribute__((always_inline)) inline

namespace k3::vecmath {

K3_OPS_INLINE float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
K3_OPS_INLINE uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

K3_OPS_INLINE float exp_fast(float x) {
  const float hi = 88.7f, lo = -87.3f;
  const float xc = x > hi ? hi : (x < lo ? lo : x);  // NaN passes through
  const float magic = 12582912.0f;                   // 1.5 * 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + magic;
  const float n = t - magic;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // t's low mantissa bits hold n (two's complement, |n| <= 128); 2^n = (n + 127) << 23, split in two
  // halves so n = 128 (x near 88.7) and n = -126 both stay representable.
  const int32_t ni = int32_t(f32_to_bits(t) - f32_to_bits(magic));
  const int32_t n1 = ni / 2, n2 = ni - n1;
  const float s1 = bits_to_f32(uint32_t(n1 + 127) << 23), s2 = bits_to_f32(uint32_t(n2 + 127) << 23);
  const float v = p * s1 * s2;
  return x < lo ? 0.0f : (x > hi ? __builtin_inff() : v);
}

K3_OPS_INLINE float sigmoid_fast(float x) { return 1.0f / (1.0f + exp_fast(-x)); }

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|) in (0, 1]: no overflow for any x.
K3_OPS_INLINE float tanh_fast(float x) {
  const float a = x < 0 ? -x : x;
  const float e = exp_fast(-2.0f * a);
  const float m = (1.0f - e) / (1.0f + e);
  return x < 0 ? -m : m;
}

// bf16 round-to-nearest-even kept in fp32 (as dtype.h round_bf16, written to vectorize).
K3_OPS_INLINE float round_bf16_fast(float f) {
  uint32_t u = f32_to_bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return bits_to_f32(nan ? ((u | 0x00400000u) & 0xffff0000u) : r);
}

}  // namespace k3::vecmath
