// kda_fast_ref.cpp: fp64 host references of the fast KDA kernels (kda_fast.h) and their shape checks.
// Prefill: the token-by-token recurrence of MODEL.md §4 step 6 per sequence, on the bf16 inputs widened.
// Decode: conv window, SiLU (bf16 out), l2norm, gate, beta, one recurrence step and the gated RMSNorm,
// each as MODEL.md §4 writes it, in fp64 except the bf16 rounding points (conv output, o).
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/kda_fast.h"

namespace k3 {

namespace {

std::string shape_of(int n_head, int d_k, int d_v) {
  return "n_head=" + std::to_string(n_head) + " d_k=" + std::to_string(d_k) + " d_v=" + std::to_string(d_v);
}

inline double bf(uint16_t x) {
  return double(bf16_to_f32(x));
}

// One recurrence step on S [K, V] (row-major): decay, delta update, read after write.
void step(std::vector<double>& S, int K, int V, const double* q, const double* k, const double* v,
          const double* g, double beta, double* o) {
  std::vector<double> u(size_t(V), 0.0);
  for (int a = 0; a < K; ++a) {
    const double alpha = std::exp(g[a]);
    for (int c = 0; c < V; ++c) {
      S[size_t(a) * V + c] *= alpha;
      u[size_t(c)] += S[size_t(a) * V + c] * k[a];
    }
  }
  for (int c = 0; c < V; ++c) u[size_t(c)] = beta * (v[c] - u[size_t(c)]);
  for (int c = 0; c < V; ++c) o[c] = 0.0;
  for (int a = 0; a < K; ++a)
    for (int c = 0; c < V; ++c) {
      S[size_t(a) * V + c] += k[a] * u[size_t(c)];
      o[c] += S[size_t(a) * V + c] * q[a];
    }
}

}  // namespace

Status kda_prefill_fast_check(const KdaPrefillParams& p) {
  const std::string what = "kda_prefill_fast: ";
  if (p.d_k != 128 || p.d_v != 128 || p.n_head <= 0)
    return error(Code::unsupported, what + "unsupported shape " + shape_of(p.n_head, p.d_k, p.d_v) +
                                        " (only d_k = d_v = 128; use kda_chunk_cuda)");
  if (p.n_seq <= 0 || p.n_tok < 0)
    return error(Code::invalid_argument,
                 what + "bad batch n_seq=" + std::to_string(p.n_seq) + " n_tok=" + std::to_string(p.n_tok));
  if (!p.cu_seqlens || !p.q || !p.k || !p.v || !p.g || !p.beta || !p.S || !p.o)
    return error(Code::invalid_argument,
                 what + "a required pointer is null (" + shape_of(p.n_head, p.d_k, p.d_v) + ")");
  return ok_status();
}

Status kda_decode_fast_check(const KdaDecodeParams& p) {
  const std::string what = "kda_decode_fast: ";
  if (p.d_k != 128 || p.d_v != 128 || p.n_head <= 0)
    return error(Code::unsupported, what + "unsupported shape " + shape_of(p.n_head, p.d_k, p.d_v) +
                                        " (only d_k = d_v = 128; use kda_recurrent_cuda)");
  if (p.n_seq <= 0) return error(Code::invalid_argument, what + "bad batch n_seq=" + std::to_string(p.n_seq));
  const bool inlined = p.S_inline[0] != nullptr;
  if (inlined && p.n_seq > KdaDecodeParams::kKdaInlineSeq)
    return error(Code::invalid_argument, what + "n_seq=" + std::to_string(p.n_seq) +
                                             " sequences with inline " + "state pointers (at most " +
                                             std::to_string(KdaDecodeParams::kKdaInlineSeq) + ")");
  bool inline_ok = inlined;
  for (int b = 0; inlined && b < p.n_seq; ++b) inline_ok = inline_ok && p.S_inline[b] && p.conv_inline[b];
  const bool per_seq = p.S_seq && p.conv_seq, slots = p.slot && p.S && p.conv;
  const bool in16 = p.qkv && p.f && p.b && p.gate;
  bool in32 = true;
  for (const float* x : p.x32) in32 = in32 && x;
  if (!(p.x32[0] ? in32 : in16) || !p.conv_w || !p.dt_bias || !p.A_log || !p.o_norm || !(p.out || p.out32) ||
      !(inlined ? inline_ok : per_seq || slots) || !p.conv_w_k != !p.conv_w_v)
    return error(Code::invalid_argument,
                 what + "a required pointer is null (" + shape_of(p.n_head, p.d_k, p.d_v) + ")");
  return ok_status();
}

void kda_prefill_fast_ref(const KdaPrefillParams& p) {
  const int H = p.n_head, K = p.d_k, V = p.d_v;
  std::vector<double> S(size_t(K) * V), q(static_cast<size_t>(K)), k(static_cast<size_t>(K)),
      g(static_cast<size_t>(K)), v(static_cast<size_t>(V)), o(static_cast<size_t>(V));
  for (int s = 0; s < p.n_seq; ++s) {
    const int slot = p.slot ? p.slot[s] : s;
    for (int h = 0; h < H; ++h) {
      float* Sh = p.S + (size_t(slot) * H + h) * K * V;
      for (size_t i = 0; i < S.size(); ++i) S[i] = p.zero_initial_state ? 0.0 : double(Sh[i]);
      for (int64_t t = p.cu_seqlens[s]; t < p.cu_seqlens[s + 1]; ++t) {
        const size_t rk = size_t(t * H + h) * K, rv = size_t(t * H + h) * V;
        for (int a = 0; a < K; ++a) {
          q[size_t(a)] = bf(p.q[rk + a]);
          k[size_t(a)] = bf(p.k[rk + a]);
          g[size_t(a)] = bf(p.g[rk + a]);
        }
        for (int c = 0; c < V; ++c) v[size_t(c)] = bf(p.v[rv + c]);
        step(S, K, V, q.data(), k.data(), v.data(), g.data(), double(p.beta[t * H + h]), o.data());
        for (int c = 0; c < V; ++c) p.o[rv + c] = f32_to_bf16(float(o[size_t(c)]));
      }
      for (size_t i = 0; i < S.size(); ++i) Sh[i] = float(S[i]);
    }
  }
}

void kda_decode_fast_ref(const KdaDecodeParams& p) {
  const int H = p.n_head, K = p.d_k, V = p.d_v, HK = H * K;
  std::vector<double> S(size_t(K) * V), x(size_t(3) * HK), o(static_cast<size_t>(V));
  // The inputs and output as kda_fast_decode_io.cuh reads them: bf16 arrays or fp32 rows (x32 / out32).
  const bool f32 = p.x32[0] != nullptr;
  auto qkv = [&](int b, int m, int c) {
    return f32 ? f32_to_bf16(p.x32[m][size_t(b) * HK + c]) : p.qkv[(size_t(b) * 3 + m) * HK + c];
  };
  auto in = [&](const uint16_t* a16, const float* a32, size_t i) {
    return f32 ? double(a32[i]) : bf(a16[i]);
  };
  for (int b = 0; b < p.n_seq; ++b) {
    const bool inlined = p.S_inline[0] != nullptr;
    const int slot = p.S_seq || inlined ? 0 : p.slot[b];
    float* Sb = inlined ? p.S_inline[b] : p.S_seq ? p.S_seq[b] : p.S + size_t(slot) * H * K * V;
    uint16_t* win = inlined      ? p.conv_inline[b]  // [3 (q,k,v)][3][HK]
                    : p.conv_seq ? p.conv_seq[b]
                                 : p.conv + size_t(slot) * 3 * 3 * HK;
    // Short conv over the window + the current input, SiLU, bf16; then roll the window.
    for (int m = 0; m < 3; ++m)
      for (int c = 0; c < HK; ++c) {
        const float* w = (m == 0 || !p.conv_w_k ? p.conv_w + size_t(m) * HK * 4 : m == 1 ? p.conv_w_k : p.conv_w_v) +
                         size_t(c) * 4;
        const uint16_t cur = qkv(b, m, c);
        uint16_t* wc = win + size_t(m) * 3 * HK + c;
        double y = double(w[3]) * bf(cur);
        for (int j = 0; j < 3; ++j) y += double(w[j]) * bf(wc[size_t(j) * HK]);
        y = y / (1.0 + std::exp(-y));
        x[size_t(m) * HK + c] = double(round_bf16(float(y)));
        wc[0] = wc[size_t(HK)];
        wc[size_t(HK)] = wc[size_t(2) * HK];
        wc[size_t(2) * HK] = cur;
      }
    for (int h = 0; h < H; ++h) {
      double* q = &x[size_t(h) * K];
      double* k = &x[size_t(HK) + size_t(h) * K];
      const double* v = &x[size_t(2) * HK + size_t(h) * V];
      double nq = 0, nk = 0;
      for (int a = 0; a < K; ++a) {
        nq += q[a] * q[a];
        nk += k[a] * k[a];
      }
      const double sq = 1.0 / std::sqrt(nq + 1e-6) / std::sqrt(double(K)), sk = 1.0 / std::sqrt(nk + 1e-6);
      for (int a = 0; a < K; ++a) {
        q[a] *= sq;
        k[a] *= sk;
      }
      std::vector<double> g(static_cast<size_t>(K));
      const double A = std::exp(double(p.A_log[h]));
      for (int a = 0; a < K; ++a) {
        const double z =
            in(p.f, p.x32[3], size_t(b) * HK + size_t(h) * K + a) + double(p.dt_bias[size_t(h) * K + a]);
        g[size_t(a)] = p.softplus_gate ? -A * (z > 20 ? z : std::log1p(std::exp(z)))
                                       : double(p.g_lower) / (1.0 + std::exp(-A * z));
      }
      const double beta = 1.0 / (1.0 + std::exp(-in(p.b, p.x32[5], size_t(b) * H + h)));
      float* Sh = Sb + size_t(h) * K * V;
      const size_t rk = size_t(b) * HK + size_t(h) * K;
      for (int a = 0; a < K; ++a) {  // the optional intermediates (v: V = K here)
        if (p.q_out) p.q_out[rk + a] = float(q[a]);
        if (p.k_out) p.k_out[rk + a] = float(k[a]);
        if (p.v_out) p.v_out[rk + a] = float(v[a]);
        if (p.g_out) p.g_out[rk + a] = float(g[size_t(a)]);
      }
      if (p.beta_out) p.beta_out[size_t(b) * H + h] = float(beta);
      for (size_t i = 0; i < S.size(); ++i) S[i] = double(Sh[i]);
      step(S, K, V, q, k, v, g.data(), beta, o.data());
      for (size_t i = 0; i < S.size(); ++i) Sh[i] = float(S[i]);
      double ms = 0;
      for (int c = 0; c < V; ++c) {
        o[size_t(c)] = double(round_bf16(float(o[size_t(c)])));
        ms += o[size_t(c)] * o[size_t(c)];
        if (p.o_out) p.o_out[size_t(b) * H * V + size_t(h) * V + c] = float(o[size_t(c)]);
      }
      const double r = 1.0 / std::sqrt(ms / V + double(p.eps));
      for (int c = 0; c < V; ++c) {
        const size_t i = size_t(b) * H * V + size_t(h) * V + c;
        const double gt = in(p.gate, p.x32[4], i);
        const double y = o[size_t(c)] * r * double(p.o_norm[c]) / (1.0 + std::exp(-gt));
        if (p.out32)
          p.out32[i] = round_bf16(float(y));
        else
          p.out[i] = f32_to_bf16(float(y));
      }
    }
  }
}

}  // namespace k3
