// cases_kda_fast.cpp: test-ops cases for the host references of the fast KDA kernels (src/ops/kda_fast.h),
// which bench/kda_cuda/bench_kda.cu holds the GPU kernels to (the GPU check needs bf16 outputs and runs on
// the GPU machine, not here).
//
// kda_fast_prefill: ref = kda.h's fp64 recurrence run sequence by sequence on the fp32 copies of the bf16
//   inputs, each sequence's state taken from its cache slot; cpu = kda_prefill_fast_ref (varlen batch,
//   permuted slots, bf16 in and out). Outputs: o (bf16 values) and every slot's state. Lengths 1, 17, 64, 65,
//   100 (chunk tails) and a zero-initial-state run.
// kda_fast_prefill_split: same ref; cpu = kda_prefill_split_emulate, the two-kernel GPU prefill emulated on the
//   host with its rounding points (fp16 scratch, tf32 operands) and windows of 2 chunks; bound NMSE 9e-6 (the
//   issue's rel-RMS 3e-3 goal). Lengths as above plus a zero-length sequence.
// kda_fast_decode: ref = kda_decode_fast_ref; cpu = the step composed here from MODEL.md §4 (conv window,
//   SiLU, bf16, l2norm, gate, beta) with kda_ref for the recurrence and the gated RMSNorm written out.
//   Outputs: out, every slot's state and conv window (rolled). Two consecutive steps, so the roll is used.
// K = V = 128 (the only shape the fast kernels serve); few heads keep the fp64 references fast.
#include <cmath>
#include <memory>
#include <numeric>

#include "core/dtype.h"
#include "harness.h"
#include "ops/kda.h"
#include "ops/kda_fast.h"

namespace k3::opt {
namespace {

constexpr int D = 128;

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
std::vector<float> widen(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
void unit_rows(Rng& rng, std::vector<float>& x, float scale) {  // rows of D: l2-normalized * scale
  for (size_t r = 0; r < x.size() / D; ++r) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += double(x[r * D + i]) * x[r * D + i];
    for (int i = 0; i < D; ++i) x[r * D + i] = float(x[r * D + i] / std::sqrt(ss) * scale);
  }
  (void)rng;
}

struct PrefillState {
  std::vector<int> lens, cu, slot;
  int H = 2, n_slot = 0;
  bool zero_state = false;
  std::vector<uint16_t> q, k, v, g;
  std::vector<float> beta, S0;
};

// split: the cpu backend is the host emulation of the two-kernel GPU prefill (windows of 2 chunks), held to
// the accuracy goal of issue 6 (rel-RMS 3e-3 on o and state: NMSE 9e-6) instead of fp64 agreement.
void add_prefill(CaseList& cases, std::vector<int> lens, bool zero_state, bool split = false) {
  auto st = std::make_shared<PrefillState>();
  st->lens = lens;
  st->zero_state = zero_state;
  std::string shape = "H=2 lens=";
  for (size_t i = 0; i < lens.size(); ++i) shape += (i ? "," : "") + std::to_string(lens[i]);
  if (zero_state) shape += " S0=0";
  cases.push_back(std::make_unique<FnCase>(
      split ? "kda_fast_prefill_split" : "kda_fast_prefill", shape, split ? 9e-6 : 1e-6,
      [st](Rng& rng) {
        const int H = st->H;
        st->cu.assign(1, 0);
        for (int l : st->lens) st->cu.push_back(st->cu.back() + l);
        const size_t n = size_t(st->cu.back()) * H * D;
        st->n_slot = int(st->lens.size()) + 1;
        st->slot.resize(st->lens.size());
        for (size_t s = 0; s < st->lens.size(); ++s) st->slot[s] = int((s + 1) % size_t(st->n_slot));
        std::vector<float> q(n), k(n), v(n), g(n);
        fill_normal(rng, q.data(), int64_t(n));
        fill_normal(rng, k.data(), int64_t(n));
        fill_normal(rng, v.data(), int64_t(n));
        fill_uniform(rng, g.data(), int64_t(n), -5.f, -1e-3f);
        unit_rows(rng, q, 1.f / std::sqrt(float(D)));
        unit_rows(rng, k, 1.f);
        st->q = to_bf16(q), st->k = to_bf16(k), st->v = to_bf16(v), st->g = to_bf16(g);
        st->beta.resize(size_t(st->cu.back()) * H);
        fill_uniform_bf16(rng, st->beta.data(), int64_t(st->beta.size()), 0.02f, 0.98f);
        st->S0.resize(size_t(st->n_slot) * H * D * D);
        fill_normal(rng, st->S0.data(), int64_t(st->S0.size()), 0.05f);
      },
      [st, split](Backend b, RunContext& ctx) {
        const int H = st->H;
        const int64_t n_tok = st->cu.back();
        float* o = ctx.out_f32(0, n_tok * H * D);
        float* S = ctx.out_f32(1, int64_t(st->S0.size()));
        std::copy(st->S0.begin(), st->S0.end(), S);
        if (b == Backend::ref) {
          const std::vector<float> q = widen(st->q), k = widen(st->k), v = widen(st->v), g = widen(st->g);
          for (size_t s = 0; s < st->lens.size(); ++s) {
            const size_t r0 = size_t(st->cu[s]) * H;
            KdaParams p;
            p.n_tok = st->lens[s], p.n_head = H, p.d_k = D, p.d_v = D;
            p.q = &q[r0 * D], p.k = &k[r0 * D], p.v = &v[r0 * D], p.g = &g[r0 * D], p.beta = &st->beta[r0];
            p.S = S + size_t(st->slot[s]) * H * D * D;
            if (st->zero_state) std::fill_n(p.S, size_t(H) * D * D, 0.f);
            p.o = o + r0 * D;
            kda_ref(p);
          }
          for (int64_t i = 0; i < n_tok * H * D; ++i) o[i] = round_bf16(o[i]);
        } else if (b == Backend::cpu) {
          std::vector<uint16_t> ob(size_t(n_tok) * H * D);
          KdaPrefillParams p;
          p.n_seq = int(st->lens.size()), p.n_tok = n_tok, p.n_head = H;
          p.cu_seqlens = st->cu.data(), p.slot = st->slot.data(), p.zero_initial_state = st->zero_state;
          p.q = st->q.data(), p.k = st->k.data(), p.v = st->v.data(), p.g = st->g.data();
          p.beta = st->beta.data(), p.S = S, p.o = ob.data();
          K3_ASSERT(kda_prefill_fast_check(p).ok());
          if (split)
            kda_prefill_split_emulate(p, 2);
          else
            kda_prefill_fast_ref(p);
          for (size_t i = 0; i < ob.size(); ++i) o[i] = bf16_to_f32(ob[i]);
        }
      }));
}

struct DecodeState {
  int n_seq = 3, H = 2, n_slot = 5;
  std::vector<uint16_t> qkv[2], f[2], b[2], gate[2], conv0;
  std::vector<float> conv_w, dt_bias, A_log, o_norm, S0;
  std::vector<int> slot;
};

// One step of MODEL.md §4 for every sequence, written out op by op, the recurrence through kda_ref.
void decode_composed(const DecodeState& st, int step, float* out, float* S, std::vector<uint16_t>& conv) {
  const int H = st.H, HK = H * D;
  for (int bq = 0; bq < st.n_seq; ++bq) {
    const int sl = st.slot[size_t(bq)];
    std::vector<float> x(size_t(3) * HK);
    for (int m = 0; m < 3; ++m)
      for (int c = 0; c < HK; ++c) {
        uint16_t* w = &conv[(size_t(sl) * 9 + size_t(m) * 3) * HK + c];  // x_{t-3}, x_{t-2}, x_{t-1}
        const uint16_t cur = st.qkv[step][(size_t(bq) * 3 + m) * HK + c];
        const float* cw = &st.conv_w[(size_t(m) * HK + c) * 4];
        double y = 0;
        const uint16_t hist[4] = {w[0], w[HK], w[2 * HK], cur};
        for (int j = 0; j < 4; ++j) y += double(cw[j]) * bf16_to_f32(hist[j]);
        x[size_t(m) * HK + c] = round_bf16(float(y / (1 + std::exp(-y))));
        w[0] = hist[1], w[HK] = hist[2], w[2 * HK] = cur;
      }
    std::vector<float> q(x.begin(), x.begin() + HK), k(x.begin() + HK, x.begin() + 2 * HK),
        v(x.begin() + 2 * HK, x.end()), g(static_cast<size_t>(HK)), beta(static_cast<size_t>(H)),
        o(static_cast<size_t>(HK));
    for (int h = 0; h < H; ++h) {
      double nq = 0, nk = 0;
      for (int i = 0; i < D; ++i) nq += double(q[size_t(h * D + i)]) * q[size_t(h * D + i)];
      for (int i = 0; i < D; ++i) nk += double(k[size_t(h * D + i)]) * k[size_t(h * D + i)];
      for (int i = 0; i < D; ++i) {
        q[size_t(h * D + i)] = float(q[size_t(h * D + i)] / std::sqrt(nq + 1e-6) / std::sqrt(double(D)));
        k[size_t(h * D + i)] = float(k[size_t(h * D + i)] / std::sqrt(nk + 1e-6));
        const double z =
            bf16_to_f32(st.f[step][size_t(bq) * HK + size_t(h * D + i)]) + st.dt_bias[size_t(h * D + i)];
        g[size_t(h * D + i)] = float(-5.0 / (1 + std::exp(-std::exp(double(st.A_log[size_t(h)])) * z)));
      }
      beta[size_t(h)] = float(1 / (1 + std::exp(-double(bf16_to_f32(st.b[step][size_t(bq) * H + h])))));
    }
    KdaParams p;
    p.n_tok = 1, p.n_head = H, p.d_k = D, p.d_v = D;
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.g = g.data(), p.beta = beta.data();
    p.S = S + size_t(sl) * H * D * D, p.o = o.data();
    kda_ref(p);
    for (int h = 0; h < H; ++h) {
      double ms = 0;
      for (int i = 0; i < D; ++i) {
        o[size_t(h * D + i)] = round_bf16(o[size_t(h * D + i)]);
        ms += double(o[size_t(h * D + i)]) * o[size_t(h * D + i)];
      }
      const double r = 1 / std::sqrt(ms / D + 1e-5);
      for (int i = 0; i < D; ++i) {
        const double gt = bf16_to_f32(st.gate[step][size_t(bq) * HK + size_t(h * D + i)]);
        out[size_t(bq) * HK + size_t(h * D + i)] =
            round_bf16(float(o[size_t(h * D + i)] * r * st.o_norm[size_t(i)] / (1 + std::exp(-gt))));
      }
    }
  }
}

void add_decode(CaseList& cases) {
  auto st = std::make_shared<DecodeState>();
  cases.push_back(std::make_unique<FnCase>(
      "kda_fast_decode", "n_seq=3 H=2 slots=5 steps=2", 1e-6,
      [st](Rng& rng) {
        const int HK = st->H * D;
        auto bf = [&](size_t n, float sd) {
          std::vector<float> x(n);
          fill_normal(rng, x.data(), int64_t(n), sd);
          return to_bf16(x);
        };
        for (int s = 0; s < 2; ++s) {
          st->qkv[s] = bf(size_t(st->n_seq) * 3 * HK, 1.f);
          st->f[s] = bf(size_t(st->n_seq) * HK, 1.f);
          st->b[s] = bf(size_t(st->n_seq) * st->H, 1.f);
          st->gate[s] = bf(size_t(st->n_seq) * HK, 1.f);
        }
        st->conv0 = bf(size_t(st->n_slot) * 9 * HK, 1.f);
        auto fl = [&](size_t n, float sd) {
          std::vector<float> x(n);
          fill_normal(rng, x.data(), int64_t(n), sd);
          return x;
        };
        st->conv_w = fl(size_t(3) * HK * 4, 0.5f), st->dt_bias = fl(size_t(HK), 1.f);
        st->A_log = fl(size_t(st->H), 0.5f), st->o_norm = fl(size_t(D), 0.3f);
        st->S0 = fl(size_t(st->n_slot) * st->H * D * D, 0.05f);
        st->slot = {3, 0, 4};
      },
      [st](Backend b, RunContext& ctx) {
        const int HK = st->H * D;
        float* out = ctx.out_f32(0, int64_t(st->n_seq) * HK * 2);
        float* S = ctx.out_f32(1, int64_t(st->S0.size()));
        float* conv_out = ctx.out_f32(2, int64_t(st->conv0.size()));
        std::copy(st->S0.begin(), st->S0.end(), S);
        std::vector<uint16_t> conv = st->conv0;
        for (int step = 0; step < 2; ++step) {
          float* out_s = out + size_t(step) * st->n_seq * HK;
          if (b == Backend::ref) {
            std::vector<uint16_t> ob(size_t(st->n_seq) * HK);
            KdaDecodeParams p;
            p.n_seq = st->n_seq, p.n_head = st->H;
            p.qkv = st->qkv[step].data(), p.conv_w = st->conv_w.data(), p.f = st->f[step].data();
            p.dt_bias = st->dt_bias.data(), p.A_log = st->A_log.data(), p.b = st->b[step].data();
            p.gate = st->gate[step].data(), p.o_norm = st->o_norm.data(), p.slot = st->slot.data();
            p.S = S, p.conv = conv.data(), p.out = ob.data();
            K3_ASSERT(kda_decode_fast_check(p).ok());
            kda_decode_fast_ref(p);
            for (size_t i = 0; i < ob.size(); ++i) out_s[i] = bf16_to_f32(ob[i]);
          } else if (b == Backend::cpu) {
            decode_composed(*st, step, out_s, S, conv);
          }
        }
        for (size_t i = 0; i < conv.size(); ++i) conv_out[i] = bf16_to_f32(conv[i]);
      }));
}

}  // namespace

K3_OP_CASES(kda_fast_cases) {
  add_prefill(cases, {17}, false);
  add_prefill(cases, {64, 1, 100}, false);
  add_prefill(cases, {65, 17}, true);
  add_prefill(cases, {17}, false, true);
  add_prefill(cases, {64, 1, 100, 0, 130}, false, true);  // a zero-length sequence, windows across sequences
  add_prefill(cases, {65, 17}, true, true);
  add_decode(cases);
}

}  // namespace k3::opt
