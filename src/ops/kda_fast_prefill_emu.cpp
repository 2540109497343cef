// kda_fast_prefill_emu.cpp: the two-kernel GPU prefill (kda_fast_prefill_intra.cu + _state.cu) emulated on
// the host with the same decomposition and rounding points, so that the algorithm and its accuracy can be
// checked without a GPU (test-ops case kda_fast_prefill_split; the GPU version itself has not run yet).
// Same chunk numbering over the batch and windows as the GPU (a window of `window` padded chunk indices,
// the state carried through its slot), same 16-row references for A and L, same substitution and block
// inverse, fp16 storage of Qe, -W, Kd, A, T, tf32 rounding of every MMA operand, fp32 accumulation and
// state, bf16 o. Not bit-exact (summation order, expf vs std::exp): equal within rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/kda_fast.h"

namespace k3 {
namespace {

constexpr int C = 64, D = 128;

float tf32(float x) {  // cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}
float fp16(float x) {  // round to the nearest fp16 value (ties to even), subnormals included; |x| < 65504
  const float a = std::fabs(x);
  if (a == 0.f || !std::isfinite(x)) return x;
  int e;
  std::frexp(a, &e);                               // a in [2^(e-1), 2^e)
  const int q = std::max(e - 11, -24);             // ulp exponent: 10 mantissa bits, subnormal ulp 2^-24
  const float ulp = std::ldexp(1.f, q);
  return std::copysign(std::nearbyint(a / ulp) * ulp, x);  // nearbyint: ties to even (default rounding)
}
float bf(uint16_t x) { return bf16_to_f32(x); }

// One chunk's scratch, as the intra kernel writes it (values already fp16-rounded).
struct Scratch {
  std::vector<float> Qe, W, Kd, A, T, dec;  // Qe, W, Kd [64][128]; A, T [64][64]; dec [128]
};

void intra(const KdaPrefillParams& p, int64_t t0, int n, int h, Scratch& s) {
  const int H = p.n_head;
  auto at = [&](int i, int d) { return (size_t(t0 + i) * H + h) * D + d; };
  auto q = [&](int i, int d) { return i < n ? bf(p.q[at(i, d)]) : 0.f; };
  auto k = [&](int i, int d) { return i < n ? bf(p.k[at(i, d)]) : 0.f; };
  std::vector<float> G(C * D), beta(C), L(C * C, 0.f);
  for (int d = 0; d < D; ++d) {
    float acc = 0.f;
    for (int i = 0; i < C; ++i) G[i * D + d] = acc += i < n ? bf(p.g[at(i, d)]) : 0.f;
  }
  for (int i = 0; i < C; ++i) beta[i] = i < n ? p.beta[size_t(t0 + i) * H + h] : 0.f;
  s.A.assign(C * C, 0.f);
  for (int a = 0; a < 4; ++a) {  // rows of block a against R_a = G_{16a}; columns j < 16 (a + 1)
    for (int r = 0; r < 16; ++r)
      for (int j = 0; j < 16 * (a + 1); ++j) {
        const int i = 16 * a + r;
        float sa = 0.f, sl = 0.f;
        for (int d = 0; d < D; ++d) {
          const float R = G[16 * a * D + d], fr = std::exp(G[i * D + d] - R);
          const float kc = tf32(k(j, d) * std::exp(R - G[j * D + d]));
          sa += tf32(q(i, d) * fr) * kc;
          sl += tf32(k(i, d) * fr) * kc;
        }
        if (j <= i) s.A[i * C + j] = fp16(sa);
        if (j < i) L[i * C + j] = beta[i] * sl;
      }
  }
  std::vector<float> T(C * C, 0.f);
  for (int a = 0; a < 4; ++a)  // diagonal blocks by substitution, column by column
    for (int c = 0; c < 16; ++c)
      for (int r = 0; r < 16; ++r) {
        float x = r == c ? 1.f : 0.f;
        for (int j = 0; j < r; ++j) x -= L[(16 * a + r) * C + 16 * a + j] * T[(16 * a + j) * C + 16 * a + c];
        T[(16 * a + r) * C + 16 * a + c] = x;
      }
  for (int dist = 1; dist < 4; ++dist)  // T_ab = -T_aa sum_{c=b}^{a-1} L_ac T_cb
    for (int b = 0; b + dist < 4; ++b) {
      const int a = b + dist;
      float P[16][16];
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          float acc = 0.f;
          for (int cc = b; cc < a; ++cc)
            for (int x = 0; x < 16; ++x) acc += L[(16 * a + r) * C + 16 * cc + x] * T[(16 * cc + x) * C + 16 * b + c];
          P[r][c] = acc;
        }
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) {
          float acc = 0.f;
          for (int x = 0; x < 16; ++x) acc += T[(16 * a + r) * C + 16 * a + x] * P[x][c];
          T[(16 * a + r) * C + 16 * b + c] = -acc;
        }
    }
  s.Qe.assign(C * D, 0.f), s.W.assign(C * D, 0.f), s.Kd.assign(C * D, 0.f), s.dec.assign(D, 0.f);
  std::vector<float> Bk(C * D);
  for (int i = 0; i < C; ++i)
    for (int d = 0; d < D; ++d) {
      const float Gv = G[i * D + d];
      s.Qe[i * D + d] = fp16(std::exp(Gv) * q(i, d));
      s.Kd[i * D + d] = fp16(std::exp(G[63 * D + d] - Gv) * k(i, d));
      Bk[i * D + d] = tf32(beta[i] * std::exp(Gv) * k(i, d));
    }
  for (int d = 0; d < D; ++d) s.dec[d] = std::exp(G[63 * D + d]);
  for (int i = 0; i < C; ++i)
    for (int d = 0; d < D; ++d) {
      float acc = 0.f;
      for (int j = 0; j <= i; ++j) acc += tf32(T[i * C + j]) * Bk[j * D + d];
      s.W[i * D + d] = fp16(acc);
    }
  s.T.resize(C * C);
  for (int e = 0; e < C * C; ++e) s.T[e] = fp16(T[e]);
}

// The state walk of one chunk on S [128][128] (fp32), as kda_fast_prefill_state.cu does per column slice.
void walk(const KdaPrefillParams& p, int64_t t0, int n, int h, const Scratch& s, float* S) {
  const int H = p.n_head;
  std::vector<float> St(D * D), bV(C * D, 0.f), Vp(C * D);
  for (int e = 0; e < D * D; ++e) St[e] = tf32(S[e]);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < D; ++c)
      bV[i * D + c] = tf32(p.beta[size_t(t0 + i) * H + h] * bf(p.v[(size_t(t0 + i) * H + h) * D + c]));
  for (int i = 0; i < C; ++i)
    for (int c = 0; c < D; ++c) {
      float acc = 0.f;
      for (int j = 0; j <= i; ++j) acc += s.T[i * C + j] * bV[j * D + c];
      for (int d = 0; d < D; ++d) acc -= s.W[i * D + d] * St[d * D + c];
      Vp[i * D + c] = tf32(acc);
    }
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < D; ++c) {
      float acc = 0.f;
      for (int d = 0; d < D; ++d) acc += s.Qe[i * D + d] * St[d * D + c];
      for (int j = 0; j <= i; ++j) acc += s.A[i * C + j] * Vp[j * D + c];
      p.o[(size_t(t0 + i) * H + h) * D + c] = f32_to_bf16(acc);
    }
  for (int d = 0; d < D; ++d)
    for (int c = 0; c < D; ++c) {
      float acc = s.dec[d] * S[d * D + c];
      for (int i = 0; i < C; ++i) acc += s.Kd[i * D + d] * Vp[i * D + c];
      S[d * D + c] = acc;
    }
}

}  // namespace

void kda_prefill_split_emulate(const KdaPrefillParams& p, int64_t window) {
  const int H = p.n_head;
  std::vector<int64_t> base(size_t(p.n_seq) + 1, 0);  // first padded chunk index of each sequence
  for (int s = 0; s < p.n_seq; ++s) base[size_t(s) + 1] = base[size_t(s)] + (p.cu_seqlens[s + 1] - p.cu_seqlens[s] + C - 1) / C;
  const int64_t max_chunks = p.n_tok / C + p.n_seq;  // the GPU's bound; the windows past the end are empty
  Scratch sc;
  for (int64_t c0 = 0; c0 < max_chunks; c0 += window) {
    const int64_t c1 = std::min(max_chunks, c0 + window);
    for (int s = 0; s < p.n_seq; ++s) {
      const int64_t cb = std::max(base[size_t(s)], c0), ce = std::min(base[size_t(s) + 1], c1);
      const bool empty_seq = base[size_t(s) + 1] == base[size_t(s)] && c0 == 0;
      if (cb >= ce && !empty_seq) continue;
      const int slot = p.slot ? p.slot[s] : s;
      for (int h = 0; h < H; ++h) {
        float* S = p.S + (size_t(slot) * H + h) * D * D;
        if (p.zero_initial_state && (cb == base[size_t(s)] || empty_seq)) std::fill_n(S, D * D, 0.f);
        for (int64_t c = cb; c < ce; ++c) {
          const int64_t j = c - base[size_t(s)], t0 = p.cu_seqlens[s] + j * C;
          const int n = int(std::min<int64_t>(C, p.cu_seqlens[s + 1] - t0));
          intra(p, t0, n, h, sc);
          walk(p, t0, n, h, sc, S);
        }
      }
    }
  }
}

}  // namespace k3
