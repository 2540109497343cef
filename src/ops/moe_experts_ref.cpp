// moe_experts_ref.cpp: plain reference of the routed MXFP4 experts (moe_experts.h), one (token, slot) at a
// time: weights decoded by core/dtype.h (e2m1 x 2^(e-127)), fp64 dot products, bf16 at every rounding point.
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/moe_experts.h"

namespace k3 {

namespace {

// dot(W[row, :], x) of an MXFP4 matrix with `cols` columns, fp64
double dot_mxfp4(const uint8_t* w, const uint8_t* s, int64_t cols, int64_t row, const float* x) {
  const uint8_t* wr = w + row * (cols / 2);
  const uint8_t* sr = s + row * (cols / 32);
  double acc = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += 32) {
    const double scale = std::ldexp(1.0, int(sr[c0 / 32]) - 127);
    for (int64_t c = c0; c < c0 + 32; ++c) {
      const uint8_t b = wr[c / 2];
      acc += double(e2m1_to_f32(c % 2 == 0 ? b & 0x0f : b >> 4)) * scale * double(x[c]);
    }
  }
  return acc;
}

}  // namespace

Status moe_experts_check(const MoeExpertsParams& p) {
  if (p.n_tok < 0 || p.k < 1 || p.k > p.n_expert || p.n_expert > kMoeMaxExpert || p.d_in <= 0 || p.d_ff <= 0 || p.d_in % 32 != 0 ||
      p.d_ff % 32 != 0 || (p.ldz != 0 && p.ldz < p.d_in) || (p.ldy != 0 && p.ldy < p.d_in))
    return error(Code::unsupported, "moe_experts: unsupported shape n_tok=" + std::to_string(p.n_tok) +
                                        " n_expert=" + std::to_string(p.n_expert) + " k=" + std::to_string(p.k) +
                                        " d_in=" + std::to_string(p.d_in) + " d_ff=" + std::to_string(p.d_ff) +
                                        " (d_in and d_ff multiples of 32, n_expert <= " + std::to_string(kMoeMaxExpert) + ")");
  return ok_status();
}

void moe_experts_ref(const MoeExpertsParams& p) {
  const int64_t ldz = p.ldz ? p.ldz : p.d_in, ldy = p.ldy ? p.ldy : p.d_in;
  std::vector<float> z(size_t(p.d_in)), h(size_t(p.d_ff));
  std::vector<double> acc(size_t(p.d_in));
  for (int64_t t = 0; t < p.n_tok; ++t) {
    for (int i = 0; i < p.d_in; ++i) z[size_t(i)] = round_bf16(p.z[t * ldz + i]);
    std::vector<float> y(size_t(p.d_in), 0.f);
    for (int j = 0; j < p.k; ++j) {
      const MoeExpertPtrs& E = p.experts[p.sel[t * p.k + j]];
      for (int f = 0; f < p.d_ff; ++f) {
        const double g = round_bf16(float(dot_mxfp4(E.w1, E.s1, p.d_in, f, z.data())));
        const double u = round_bf16(float(dot_mxfp4(E.w3, E.s3, p.d_in, f, z.data())));
        double v;
        if (p.act == MoeAct::situ) {
          const double a = p.beta1 * std::tanh(g / p.beta1) / (1.0 + std::exp(-g));
          v = a * (p.beta2 > 0 ? p.beta2 * std::tanh(u / p.beta2) : u);
        } else {
          v = g / (1.0 + std::exp(-g)) * u;
        }
        h[size_t(f)] = round_bf16(float(v));
      }
      const float w = p.wt[t * p.k + j];
      for (int i = 0; i < p.d_in; ++i)  // fp32 sum in slot order
        y[size_t(i)] += w * round_bf16(float(dot_mxfp4(E.w2, E.s2, p.d_ff, i, h.data())));
    }
    for (int i = 0; i < p.d_in; ++i) p.y[t * ldy + i] = round_bf16(y[size_t(i)]);
  }
}

}  // namespace k3
