// cases_kda_decode_ext.cpp: test-ops cases for the optional fields of KdaDecodeParams (src/ops/kda_fast.h)
// that the GPU model's fast KDA path uses, on the fp64 host reference (the GPU kernel that serves them,
// kda_fast_decode_tma.cu, is also checked against this reference by bench_kda on the GPU machine).
//
// kda_fast_decode_ext: ref = kda_decode_fast_ref with per-sequence state pointers (S_seq, conv_seq), the conv
//   taps in three arrays (conv_w_k, conv_w_v) and every traced intermediate requested (q_out ... o_out);
//   cpu = the step composed here from MODEL.md §4 (conv window, SiLU, bf16, l2norm, gate, beta; kda_ref for
//   the recurrence; the gated RMSNorm written out). Two gates: K3's g = -5 sigmoid(exp(A_log) z) and KL's
//   g = -exp(A_log) softplus(z) (softplus_gate). Outputs: out, every sequence's state and rolled conv window,
//   and the intermediates q^, k^, v, g, o, beta. Two consecutive steps, 3 sequences, 2 heads of K = V = 128.
// kda_fast_decode_rows: the fp32-row inputs and output, inline or tabled state pointers, also on the GPU
//   (add_rows32 below).
#include <cmath>
#include <memory>

#include "core/dtype.h"
#include "harness.h"
#include "ops/kda.h"
#include "ops/kda_fast.h"

namespace k3::opt {
namespace {

constexpr int D = 128, NS = 3, H = 2, HK = H * D;

struct Ext {
  bool softplus = false;
  std::vector<uint16_t> qkv[2], f[2], b[2], gate[2], conv0;   // conv0 [NS, 3, 3, HK]
  std::vector<float> wq, wk, wv, dt_bias, A_log, o_norm, S0;  // w* [HK, 4]; S0 [NS, H, D, D]
};

// One step for every sequence, op by op; trace = [NS, 5 HK] (q^, k^, v, g, o) + [NS, H] beta.
void composed(const Ext& e, int step, float* out, float* S, std::vector<uint16_t>& conv, float* trace) {
  for (int s = 0; s < NS; ++s) {
    std::vector<float> x(size_t(3) * HK);
    for (int m = 0; m < 3; ++m)
      for (int c = 0; c < HK; ++c) {
        uint16_t* w = &conv[(size_t(s) * 9 + size_t(m) * 3) * HK + c];
        const uint16_t cur = e.qkv[step][(size_t(s) * 3 + m) * HK + c];
        const float* cw = &(m == 0 ? e.wq : m == 1 ? e.wk : e.wv)[size_t(c) * 4];
        const uint16_t hist[4] = {w[0], w[HK], w[2 * HK], cur};
        double y = 0;
        for (int j = 0; j < 4; ++j) y += double(cw[j]) * bf16_to_f32(hist[j]);
        x[size_t(m) * HK + c] = round_bf16(float(y / (1 + std::exp(-y))));
        w[0] = hist[1], w[HK] = hist[2], w[2 * HK] = cur;
      }
    std::vector<float> q(x.begin(), x.begin() + HK), k(x.begin() + HK, x.begin() + 2 * HK),
        v(x.begin() + 2 * HK, x.end()), g(size_t(HK), 0.f), beta(size_t(H), 0.f), o(size_t(HK), 0.f);
    for (int h = 0; h < H; ++h) {
      double nq = 0, nk = 0;
      for (int i = 0; i < D; ++i) nq += double(q[size_t(h * D + i)]) * q[size_t(h * D + i)];
      for (int i = 0; i < D; ++i) nk += double(k[size_t(h * D + i)]) * k[size_t(h * D + i)];
      const double A = std::exp(double(e.A_log[size_t(h)]));
      for (int i = 0; i < D; ++i) {
        const size_t j = size_t(h * D + i);
        q[j] = float(q[j] / std::sqrt(nq + 1e-6) / std::sqrt(double(D)));
        k[j] = float(k[j] / std::sqrt(nk + 1e-6));
        const double z = bf16_to_f32(e.f[step][size_t(s) * HK + j]) + e.dt_bias[j];
        g[j] =
            float(e.softplus ? -A * (z > 20 ? z : std::log1p(std::exp(z))) : -5.0 / (1 + std::exp(-A * z)));
      }
      beta[size_t(h)] = float(1 / (1 + std::exp(-double(bf16_to_f32(e.b[step][size_t(s) * H + h])))));
    }
    KdaParams p;
    p.n_tok = 1, p.n_head = H, p.d_k = D, p.d_v = D;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data();
    p.S = S + size_t(s) * H * D * D, p.o = o.data();
    kda_ref(p);
    float* tr = trace + size_t(s) * 5 * HK;
    for (int j = 0; j < HK; ++j) {
      o[size_t(j)] = round_bf16(o[size_t(j)]);
      tr[j] = q[size_t(j)], tr[HK + j] = k[size_t(j)], tr[2 * HK + j] = v[size_t(j)];
      tr[3 * HK + j] = g[size_t(j)], tr[4 * HK + j] = o[size_t(j)];
    }
    for (int h = 0; h < H; ++h) {
      trace[size_t(NS) * 5 * HK + size_t(s) * H + h] = beta[size_t(h)];
      double ms = 0;
      for (int i = 0; i < D; ++i) ms += double(o[size_t(h * D + i)]) * o[size_t(h * D + i)];
      const double r = 1 / std::sqrt(ms / D + 1e-5);
      for (int i = 0; i < D; ++i) {
        const size_t j = size_t(h * D + i);
        const double gt = bf16_to_f32(e.gate[step][size_t(s) * HK + j]);
        out[size_t(s) * HK + j] = round_bf16(float(o[j] * r * e.o_norm[size_t(i)] / (1 + std::exp(-gt))));
      }
    }
  }
}

// Random inputs of both case kinds: bf16 projections of two steps, windows, fp32 taps, gate and norm
// parameters, states.
void fill(Ext& e, Rng& rng) {
  auto fl = [&](size_t n, float sd) {
    std::vector<float> x(n);
    fill_normal(rng, x.data(), int64_t(n), sd);
    return x;
  };
  auto bf = [&](size_t n, float sd) {
    std::vector<float> x = fl(n, sd);
    std::vector<uint16_t> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
    return y;
  };
  for (int s = 0; s < 2; ++s) {
    e.qkv[s] = bf(size_t(NS) * 3 * HK, 1.f), e.f[s] = bf(size_t(NS) * HK, 1.f);
    e.b[s] = bf(size_t(NS) * H, 1.f), e.gate[s] = bf(size_t(NS) * HK, 1.f);
  }
  e.conv0 = bf(size_t(NS) * 9 * HK, 1.f);
  e.wq = fl(size_t(HK) * 4, 0.5f), e.wk = fl(size_t(HK) * 4, 0.5f), e.wv = fl(size_t(HK) * 4, 0.5f);
  e.dt_bias = fl(size_t(HK), 1.f), e.A_log = fl(size_t(H), 0.5f), e.o_norm = fl(size_t(D), 0.3f);
  e.S0 = fl(size_t(NS) * H * D * D, 0.05f);
}

void add_ext(CaseList& cases, bool softplus) {
  auto e = std::make_shared<Ext>();
  e->softplus = softplus;
  cases.push_back(std::make_unique<FnCase>(
      "kda_fast_decode_ext",
      std::string(softplus ? "KL gate" : "K3 gate") + " n_seq=3 H=2 steps=2, per-seq state", 1e-6,
      [e](Rng& rng) { fill(*e, rng); },
      [e](Backend b, RunContext& ctx) {
        float* out = ctx.out_f32(0, int64_t(NS) * HK * 2);
        float* S = ctx.out_f32(1, int64_t(e->S0.size()));
        float* conv_out = ctx.out_f32(2, int64_t(e->conv0.size()));
        float* trace = ctx.out_f32(3, (int64_t(NS) * 5 * HK + NS * H) * 2);
        std::copy(e->S0.begin(), e->S0.end(), S);
        std::vector<uint16_t> conv = e->conv0;
        for (int step = 0; step < 2; ++step) {
          float* out_s = out + size_t(step) * NS * HK;
          float* tr = trace + size_t(step) * (NS * 5 * HK + NS * H);
          if (b == Backend::ref) {
            std::vector<uint16_t> ob(size_t(NS) * HK);
            std::vector<float> dq(size_t(NS) * HK), dk(dq.size()), dv(dq.size()), dg(dq.size()),
                dout(dq.size());
            float* Sp[NS];
            uint16_t* Cp[NS];
            for (int s = 0; s < NS; ++s)
              Sp[s] = S + size_t(s) * H * D * D, Cp[s] = conv.data() + size_t(s) * 9 * HK;
            KdaDecodeParams p;
            p.n_seq = NS, p.n_head = H, p.softplus_gate = e->softplus;
            p.qkv = e->qkv[step].data(), p.f = e->f[step].data(), p.b = e->b[step].data();
            p.gate = e->gate[step].data(), p.out = ob.data();
            p.conv_w = e->wq.data(), p.conv_w_k = e->wk.data(), p.conv_w_v = e->wv.data();
            p.dt_bias = e->dt_bias.data(), p.A_log = e->A_log.data(), p.o_norm = e->o_norm.data();
            p.S_seq = Sp, p.conv_seq = Cp;
            p.q_out = dq.data(), p.k_out = dk.data(), p.v_out = dv.data(), p.g_out = dg.data();
            p.o_out = dout.data(), p.beta_out = tr + size_t(NS) * 5 * HK;
            K3_ASSERT(kda_decode_fast_check(p).ok());
            kda_decode_fast_ref(p);
            for (size_t i = 0; i < ob.size(); ++i) out_s[i] = bf16_to_f32(ob[i]);
            for (int s = 0; s < NS; ++s)
              for (int j = 0; j < HK; ++j) {
                float* t = tr + size_t(s) * 5 * HK;
                const size_t r = size_t(s) * HK + j;
                t[j] = dq[r], t[HK + j] = dk[r], t[2 * HK + j] = dv[r], t[3 * HK + j] = dg[r];
                t[4 * HK + j] = dout[r];
              }
          } else if (b == Backend::cpu) {
            composed(*e, step, out_s, S, conv, tr);
          }
        }
        for (size_t i = 0; i < conv.size(); ++i) conv_out[i] = bf16_to_f32(conv[i]);
      }));
}

// kda_fast_decode_rows: the GPU model's decode-step form, on every backend: the inputs as fp32 rows (x32)
// and y as fp32 (out32), the states behind inline pointers (S_inline) or a device table (S_seq). ref =
// kda_decode_fast_ref, cpu = the composed step on the bf16 arrays holding the same values, cuda =
// kda_decode_fast_cuda (the cluster kernel below 8 sequences). Outputs: y of two steps (the second reads
// the window the first rolled) and the final states. K3 gate, 3 sequences, 2 heads.
void add_rows32(CaseList& cases, bool inlined) {
  auto e = std::make_shared<Ext>();
  cases.push_back(std::make_unique<FnCase>(
      "kda_fast_decode_rows",
      std::string("n_seq=3 H=2 steps=2, fp32 rows, ") + (inlined ? "inline" : "table"), 1e-6,
      [e](Rng& rng) { fill(*e, rng); },
      [e, inlined](Backend b, RunContext& ctx) {
        float* out = ctx.out_f32(0, int64_t(NS) * HK * 2);
        float* S = ctx.out_f32(1, int64_t(e->S0.size()));
        std::copy(e->S0.begin(), e->S0.end(), S);
        if (b == Backend::cpu) {
          std::vector<uint16_t> conv = e->conv0;
          std::vector<float> trace(size_t(NS) * (5 * HK + H));
          for (int step = 0; step < 2; ++step)
            composed(*e, step, out + size_t(step) * NS * HK, S, conv, trace.data());
          return;
        }
        // x32 rows of one step: q~, k~, v~, f, gate [NS, HK], b [NS, H]
        auto rows = [&](int step) {
          std::vector<std::vector<float>> x(6);
          for (int m = 0; m < 3; ++m)
            for (int s = 0; s < NS; ++s)
              for (int c = 0; c < HK; ++c)
                x[size_t(m)].push_back(bf16_to_f32(e->qkv[step][(size_t(s) * 3 + size_t(m)) * HK + c]));
          for (uint16_t v : e->f[step]) x[3].push_back(bf16_to_f32(v));
          for (uint16_t v : e->gate[step]) x[4].push_back(bf16_to_f32(v));
          for (uint16_t v : e->b[step]) x[5].push_back(bf16_to_f32(v));
          return x;
        };
        auto params = [&](float* S_base, uint16_t* conv_base, const float* const* Sq,
                          const uint16_t* const* Cq) {
          KdaDecodeParams p;
          p.n_seq = NS, p.n_head = H;
          p.conv_w = e->wq.data(), p.conv_w_k = e->wk.data(), p.conv_w_v = e->wv.data();
          p.dt_bias = e->dt_bias.data(), p.A_log = e->A_log.data(), p.o_norm = e->o_norm.data();
          for (int s = 0; inlined && s < NS; ++s)
            p.S_inline[s] = S_base + size_t(s) * H * D * D, p.conv_inline[s] = conv_base + size_t(s) * 9 * HK;
          if (!inlined)
            p.S_seq = const_cast<float* const*>(Sq), p.conv_seq = const_cast<uint16_t* const*>(Cq);
          return p;
        };
        if (b == Backend::ref) {
          std::vector<uint16_t> conv = e->conv0;
          float* Sp[NS];
          uint16_t* Cp[NS];
          for (int s = 0; s < NS; ++s)
            Sp[s] = S + size_t(s) * H * D * D, Cp[s] = conv.data() + size_t(s) * 9 * HK;
          for (int step = 0; step < 2; ++step) {
            const auto x = rows(step);
            KdaDecodeParams p = params(S, conv.data(), Sp, Cp);
            for (int m = 0; m < 6; ++m) p.x32[m] = x[size_t(m)].data();
            p.out32 = out + size_t(step) * NS * HK;
            K3_ASSERT(kda_decode_fast_check(p).ok());
            kda_decode_fast_ref(p);
          }
          return;
        }
#ifdef K3_HAVE_CUDA
        float* dS = ctx.dev_out_f32(1, int64_t(e->S0.size()));
        float* dout = ctx.dev_out_f32(0, int64_t(NS) * HK * 2);
        uint16_t* dconv = const_cast<uint16_t*>(ctx.dev_in(e->conv0));
        std::vector<uint64_t> tab(size_t(2) * NS);
        for (int s = 0; s < NS; ++s) {
          tab[size_t(s)] = reinterpret_cast<uint64_t>(dS + size_t(s) * H * D * D);
          tab[size_t(NS + s)] = reinterpret_cast<uint64_t>(dconv + size_t(s) * 9 * HK);
        }
        const uint64_t* dtab = ctx.dev_in(tab);
        KdaDecodeParams p = params(dS, dconv, reinterpret_cast<const float* const*>(dtab),
                                   reinterpret_cast<const uint16_t* const*>(dtab + NS));
        p.conv_w = ctx.dev_in(e->wq), p.conv_w_k = ctx.dev_in(e->wk), p.conv_w_v = ctx.dev_in(e->wv);
        p.dt_bias = ctx.dev_in(e->dt_bias), p.A_log = ctx.dev_in(e->A_log), p.o_norm = ctx.dev_in(e->o_norm);
        KdaDecodeParams ps[2] = {p, p};
        for (int step = 0; step < 2; ++step) {
          const auto x = rows(step);
          for (int m = 0; m < 6; ++m) ps[step].x32[m] = ctx.dev_in(x[size_t(m)]);
          ps[step].out32 = dout + size_t(step) * NS * HK;
        }
        ctx.gpu_run([&] {
          for (const KdaDecodeParams& q : ps) K3_ASSERT(kda_decode_fast_cuda(q, *ctx.gpu).ok());
        });
#endif
      },
      false, 0, 0, kCudaBuilt));
}

}  // namespace

K3_OP_CASES(kda_decode_ext_cases) {
  add_ext(cases, false);
  add_ext(cases, true);
  add_rows32(cases, true);
  add_rows32(cases, false);
}

}  // namespace k3::opt
