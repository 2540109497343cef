// linear_ref.cpp: the plain reference for linear.h. One output at a time, every weight decoded exactly
// (to fp64, so an E8M0 scale of 2^127 times 6 does not overflow), fp64 accumulation, no SIMD, no blocking.
//
//   y[t, o] = float( sum_i double(x[t, i]) * W[o, i] )
#include <cmath>

#include "core/status.h"
#include "ops/linear.h"

namespace k3 {

namespace {

// W[o, i] exactly, as fp64.
double weight_at(const LinearWeight& W, int64_t o, int64_t i) {
  if (W.is_mxfp4()) {
    const uint8_t byte = static_cast<const uint8_t*>(W.w)[o * (W.in / 2) + i / 2];
    const uint8_t nib = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
    const uint8_t e = W.scale[o * (W.in / 32) + i / 32];
    K3_ASSERT(e != 255);
    return double(e2m1_to_f32(nib)) * std::ldexp(1.0, int(e) - 127);
  }
  const int64_t k = o * W.in + i;
  switch (W.dtype) {
    case DType::f32: return static_cast<const float*>(W.w)[k];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(W.w)[k]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(W.w)[k]);
    case DType::f8_e4m3: return f8_e4m3_to_f32(static_cast<const uint8_t*>(W.w)[k]);
    default: K3_ASSERT(!"linear: unsupported weight dtype");
  }
  return 0;
}

}  // namespace

void linear_ref(const LinearWeight& W, const LinearParams& p) {
  K3_ASSERT(!W.is_mxfp4() || W.in % 32 == 0);
  const int64_t ldx = p.ldx ? p.ldx : W.in, ldy = p.ldy ? p.ldy : W.out;
  for (int64_t t = 0; t < p.n_tok; ++t) {
    const float* x = p.x + t * ldx;
    for (int64_t o = 0; o < W.out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < W.in; ++i) acc += double(x[i]) * weight_at(W, o, i);
      p.y[t * ldy + o] = p.round_bf16 ? round_bf16(float(acc)) : float(acc);
    }
  }
}

void linear_ref(const LinearWeight& W, const float* x, float* y, int64_t n_tok) {
  LinearParams p;
  p.n_tok = n_tok;
  p.x = x;
  p.y = y;
  linear_ref(W, p);
}

int64_t mxfp4_find_bad_scale(const uint8_t* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (scale[i] == 255) return i;
  return -1;
}

}  // namespace k3
