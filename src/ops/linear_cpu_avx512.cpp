// linear_cpu_avx512.cpp: AVX-512 micro-kernels for linear_cpu (linear.h), compiled with function target
// attributes and only called when cpu_level() says the CPU has them.
//
// fp32 path (exact x): per 16 columns, decode W[r, i..i+16) to fp32 in a register (bf16: shift; f16:
//   vcvtph2ps; fp8 e4m3: bits placed in an f16 then x 2^8; f32: load), then acc[r][t] += w * x[t].
//   MXFP4: per 32-group, two vpermps lookups of the e2m1 magnitudes (even / odd columns), partial =
//   w_even*x_even + w_odd*x_odd, then
//   acc += partial * 2^(e-127) (the scale is applied once per group, exactly, so it cannot overflow early).
// bf16 path (bf16 weights, x already bf16-rounded and copied to bf16 by linear_cpu): vdpbf16ps on 32
//   columns at a time (exact products, fp32 sums; the instruction treats subnormals as zero).
//   MXFP4 always takes the fp32 path: a vpermw-to-bf16 + vdpbf16ps variant measured slower (CPU time,
//   T = 1 and T = 64) than the two vpermps lookups, and the fp32 path keeps x exact anyway.
// Every tile keeps its RB x TB accumulators in registers (the loops over r and t are fully unrolled: without
//   that GCC 12 kept a stack copy of the accumulator array and stored all of it on every K step, which
//   made the store port the bottleneck) and reduces four rows' accumulators at once (hsum4: the 16 lanes of
//   each are summed in a fixed order, the same for a one-row tile, so a row's value does not depend on the
//   tile it fell in).
#include <immintrin.h>

#include "core/status.h"
#include "ops/linear_kernels.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
// GCC 12's _mm512_undefined_* (self-initialized) trips -Wmaybe-uninitialized inside the intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace k3::linear_detail {

namespace {

inline __mmask16 tail_mask16(int64_t n) { return __mmask16((1u << n) - 1); }

// One fp32 vector of 16 weights from row pointer p (element index i), optionally masked.
struct DecF32 {
  static __m512 load(const void* p, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
};
struct DecBf16 {
  static __m512 load(const void* p, int64_t i, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};
struct DecF16 {
  static __m512 load(const void* p, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
};
struct DecFp8 {
  // e4m3 s.eeee.mmm -> f16 bits s.0eeee.mmm0000000 is the same value times 2^-8 (subnormals included);
  // 0x7f / 0xff (NaN in E4M3FN) would decode to 480, so they are patched to NaN.
  static __m512 load(const void* p, int64_t i, __mmask16 m) {
    const __m128i b = _mm_maskz_loadu_epi8(m, static_cast<const uint8_t*>(p) + i);
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_srli_epi16(w, 7), 15));
    const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
  }
};

// 32 MXFP4 nibbles of one group (16 bytes) as bytes in column order: lo = columns 0..15, hi = 16..31.
inline void mxfp4_nibbles(const uint8_t* p, __m128i* lo, __m128i* hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i even = _mm_and_si128(b, m), odd = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  *lo = _mm_unpacklo_epi8(even, odd);
  *hi = _mm_unpackhi_epi8(even, odd);
}

inline __m512 e2m1_lut() {
  return _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f);
}

inline __m512 scale_of(const uint8_t* s) { return _mm512_castsi512_ps(_mm512_set1_epi32(int(e8m0_bits(*s)))); }

// Lane sums of a, b, c, d as {sum a, sum b, sum c, sum d}: within each 128-bit lane (x0 + x2) + (x1 + x3),
// then lanes (L0 + L2) + (L1 + L3).
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Stores the RB x TB accumulators: y[t0 + t, r0 + r] = lane sum of acc[r][t] (RB is 4 or 1).
template <int RB, int TB>
inline void store_tile(const Job& j, int64_t r0, int64_t t0, const __m512 (&acc)[RB][TB]) {
#pragma GCC unroll 8
  for (int t = 0; t < TB; ++t) {
    float* y = j.y + (t0 + t) * j.ldy + r0;
    if constexpr (RB == 4) {
      _mm_storeu_ps(y, hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) y[r] = _mm_cvtss_f32(hsum4(acc[r][t], acc[r][t], acc[r][t], acc[r][t]));
    }
  }
}

template <class Dec>
struct Dense {
  template <int RB, int TB>
  struct Tile {
    static void run(const Job& j, int64_t r0, int64_t t0) {
      const LinearWeight& W = *j.W;
      const size_t esz = dtype_size(W.dtype);
      const char* wrow[RB];
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) wrow[r] = static_cast<const char*>(W.w) + (r0 + r) * W.in * esz;
      __m512 acc[RB][TB];
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
      const float* xrow[TB];
#pragma GCC unroll 8
      for (int t = 0; t < TB; ++t) xrow[t] = j.x + (t0 + t) * j.ldx;
      int64_t i = 0;
      for (; i + 16 <= W.in; i += 16) {
        __m512 xv[TB];
#pragma GCC unroll 8
        for (int t = 0; t < TB; ++t) xv[t] = _mm512_loadu_ps(xrow[t] + i);
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) {
          const __m512 w = Dec::load(wrow[r], i, __mmask16(0xffff));
#pragma GCC unroll 8
          for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(w, xv[t], acc[r][t]);
        }
      }
      if (i < W.in) {  // masked tail: the loads touch nothing past the row
        const __mmask16 m = tail_mask16(W.in - i);
        __m512 xv[TB];
#pragma GCC unroll 8
        for (int t = 0; t < TB; ++t) xv[t] = _mm512_maskz_loadu_ps(m, xrow[t] + i);
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) {
          const __m512 w = Dec::load(wrow[r], i, m);
#pragma GCC unroll 8
          for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_fmadd_ps(w, xv[t], acc[r][t]);
        }
      }
      store_tile<RB, TB>(j, r0, t0, acc);
    }
  };
};

// Per 32-group: byte k holds columns 2k (low nibble) and 2k+1 (high nibble). The 16 bytes widened to
// dwords index vpermps directly (it reads only bits 3..0): z -> even columns, z >> 4 -> odd columns; x is
// split into its even and odd columns to match (two shuffles per token, shared by the RB rows).
template <int RB, int TB>
struct Mxfp4Tile {
  static void run(const Job& j, int64_t r0, int64_t t0) {
    const LinearWeight& W = *j.W;
    const int64_t n_group = W.in / 32;
    const __m512 lut = e2m1_lut();
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 acc[RB][TB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < n_group; ++g) {
      __m512 xe[TB], xo[TB];
#pragma GCC unroll 8
      for (int t = 0; t < TB; ++t) {
        const __m512 x0 = _mm512_loadu_ps(j.x + (t0 + t) * j.ldx + 32 * g);
        const __m512 x1 = _mm512_loadu_ps(j.x + (t0 + t) * j.ldx + 32 * g + 16);
        xe[t] = _mm512_permutex2var_ps(x0, even, x1);
        xo[t] = _mm512_permutex2var_ps(x0, odd, x1);
      }
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        const __m128i b = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(W.w) + (r0 + r) * (W.in / 2) + 16 * g));
        const __m512i z = _mm512_cvtepu8_epi32(b);
        const __m512 we = _mm512_permutexvar_ps(z, lut);
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), lut);
        const __m512 s = scale_of(W.scale + (r0 + r) * n_group + g);
#pragma GCC unroll 8
        for (int t = 0; t < TB; ++t) {
          const __m512 part = _mm512_fmadd_ps(wo, xo[t], _mm512_mul_ps(we, xe[t]));
          acc[r][t] = _mm512_fmadd_ps(part, s, acc[r][t]);
        }
      }
    }
    store_tile<RB, TB>(j, r0, t0, acc);
  }
};

// ---- bf16 path: x as bf16 in j.xb (zero-padded to a multiple of 32 columns) ----

inline __m512 dot_bf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

template <int RB, int TB>
struct Bf16Tile {
  static void run(const Job& j, int64_t r0, int64_t t0) {
    const LinearWeight& W = *j.W;
    const uint16_t* wrow[RB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) wrow[r] = static_cast<const uint16_t*>(W.w) + (r0 + r) * W.in;
    __m512 acc[RB][TB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < TB; ++t) acc[r][t] = _mm512_setzero_ps();
    const auto step = [&](int64_t i, __mmask32 m) {
      __m512i xv[TB];
#pragma GCC unroll 8
      for (int t = 0; t < TB; ++t) xv[t] = _mm512_loadu_si512(j.xb + (t0 + t) * j.ldxb + i);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        const __m512i w = _mm512_maskz_loadu_epi16(m, wrow[r] + i);
#pragma GCC unroll 8
        for (int t = 0; t < TB; ++t) acc[r][t] = dot_bf16(acc[r][t], w, xv[t]);
      }
    };
    int64_t i = 0;
    for (; i + 32 <= W.in; i += 32) step(i, __mmask32(0xffffffffu));
    if (i < W.in) step(i, __mmask32((1u << (W.in - i)) - 1));  // x is zero-padded; W is masked
    store_tile<RB, TB>(j, r0, t0, acc);
  }
};

}  // namespace

void rows_avx512(const Job& j, int64_t r0, int64_t r1) {
  const LinearWeight& W = *j.W;
  if (W.is_mxfp4()) return run_tiles<Mxfp4Tile>(j, r0, r1);
  switch (W.dtype) {
    case DType::f32: return run_tiles<Dense<DecF32>::Tile>(j, r0, r1);
    case DType::bf16: return run_tiles<Dense<DecBf16>::Tile>(j, r0, r1);
    case DType::f16: return run_tiles<Dense<DecF16>::Tile>(j, r0, r1);
    case DType::f8_e4m3: return run_tiles<Dense<DecFp8>::Tile>(j, r0, r1);
    default: K3_ASSERT(!"linear: unsupported weight dtype");
  }
}

void rows_avx512_bf16(const Job& j, int64_t r0, int64_t r1) {
  K3_ASSERT(j.W->dtype == DType::bf16);
  run_tiles<Bf16Tile>(j, r0, r1);
}

void decode_row_avx512(const LinearWeight& W, int64_t row, int64_t col0, int64_t n, float* out) {
  K3_ASSERT(col0 % 16 == 0);
  for (int64_t k = 0; k < n; k += 16) {
    const int64_t i = col0 + k;
    const __mmask16 m = n - k >= 16 ? __mmask16(0xffff) : tail_mask16(n - k);
    __m512 v;
    if (W.is_mxfp4()) {
      __m128i lo, hi;
      mxfp4_nibbles(static_cast<const uint8_t*>(W.w) + row * (W.in / 2) + 16 * (i / 32), &lo, &hi);
      v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i % 32 == 0 ? lo : hi), e2m1_lut());
      v = _mm512_mul_ps(v, scale_of(W.scale + row * (W.in / 32) + i / 32));
    } else {
      const void* p = static_cast<const char*>(W.w) + row * W.in * dtype_size(W.dtype);
      switch (W.dtype) {
        case DType::f32: v = DecF32::load(p, i, m); break;
        case DType::bf16: v = DecBf16::load(p, i, m); break;
        case DType::f16: v = DecF16::load(p, i, m); break;
        case DType::f8_e4m3: v = DecFp8::load(p, i, m); break;
        default: K3_ASSERT(!"linear: unsupported weight dtype"); v = _mm512_setzero_ps();
      }
    }
    _mm512_mask_storeu_ps(out + k, m, v);
  }
}

}  // namespace k3::linear_detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
