// kda.cpp: the KDA token mixer (kda.h, MODEL.md §4).
#include "model/kda.h"

#include <cmath>

#include "model/parallel.h"
#include "ops/kda.h"

namespace k3 {

Status bind_kda(Binder& b, const ModelConfig& cfg, KdaWeights* w) {
  const int64_t H = cfg.kda.n_head, K = cfg.kda.d_head, HK = H * K, D = cfg.d_model, W = cfg.kda.conv_size;
  w->q_proj = b.linear("q_proj", HK, D);
  w->k_proj = b.linear("k_proj", HK, D);
  w->v_proj = b.linear("v_proj", HK, D);
  w->q_conv = b.vec("q_conv1d.weight", HK * W);
  w->k_conv = b.vec("k_conv1d.weight", HK * W);
  w->v_conv = b.vec("v_conv1d.weight", HK * W);
  w->f_a_proj = b.linear("f_a_proj", -1, D);
  w->f_b_proj = b.linear("f_b_proj", HK, w->f_a_proj.out);
  w->dt_bias = b.vec("dt_bias", HK);
  w->A_log = b.vec("A_log", -1);
  w->b_proj = b.linear("b_proj", H, D);
  if (cfg.kda.full_rank_gate) {
    w->g_proj = b.linear("g_proj", HK, D);
  } else {
    w->g_a_proj = b.linear("g_a_proj", -1, D);
    w->g_b_proj = b.linear("g_b_proj", HK, w->g_a_proj.out);
  }
  w->o_norm = b.vec("o_norm.weight", K);
  w->o_proj = b.linear("o_proj", D, HK);
  K3_RETURN_IF_ERROR(b.status());
  // A_log: KL [1,1,H,1]; K3 [>= H] with a zero tail (MODEL.md §4 step 5, §13 #4).
  if (int64_t(w->A_log.size()) < H)
    return error(Code::bad_file, b.prefix() + "A_log has fewer than " + std::to_string(H) + " entries");
  for (size_t i = size_t(H); i < w->A_log.size(); ++i)
    if (w->A_log[i] != 0.f)
      return error(Code::bad_file, b.prefix() + "A_log has a nonzero tail beyond the heads");
  w->A_log.resize(size_t(H));
  return ok_status();
}

void init_kda_state(const ModelConfig& cfg, KdaState* s) {
  const int64_t H = cfg.kda.n_head, K = cfg.kda.d_head;
  s->S.assign(size_t(H * K * K), 0.f);
  s->conv.assign(size_t(3 * (cfg.kda.conv_size - 1) * H * K), 0.f);
}

namespace {

// y_t[c] = SiLU(sum_j w[c, j] win[t + j][c]) over the window [state rows | x rows]; updates the state.
void short_conv(const Ctx& c, const float* w, int W, float* state, float* x, int64_t n_tok, int64_t C) {
  std::vector<float> win(size_t((W - 1 + n_tok) * C));
  std::copy(state, state + (W - 1) * C, win.begin());
  std::copy(x, x + n_tok * C, win.begin() + (W - 1) * C);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* y = x + t * C;
    for (int64_t ch = 0; ch < C; ++ch) {
      float acc = 0.f;
      for (int j = 0; j < W; ++j) acc += w[ch * W + j] * win[size_t((t + j) * C + ch)];
      y[ch] = siluf(acc);
    }
  }
  c.rnd(x, n_tok * C);
  std::copy(win.end() - (W - 1) * C, win.end(), state);
}

}  // namespace

void kda_forward(const Ctx& c, const ModelConfig& cfg, const KdaWeights& w, const KdaExec& ex,
                 std::span<const KdaSeq> seqs, const float* x, int64_t n_tok, float* out, int layer) {
  const int64_t H = cfg.kda.n_head, K = cfg.kda.d_head, HK = H * K;
  const int W = cfg.kda.conv_size;
  std::vector<float> q, k, v, bt, fa, g, ga, gate;
  linear(c, w.q_proj, x, n_tok, q);
  linear(c, w.k_proj, x, n_tok, k);
  linear(c, w.v_proj, x, n_tok, v);
  const int64_t win = int64_t(W - 1) * HK;
  if (c.par) c.par->kda_conv_halo(c, layer, seqs, q.data(), k.data(), v.data(), HK, W);
  for (const KdaSeq& s : seqs) {
    float* conv = s.st->conv.data();
    short_conv(c, w.q_conv.data(), W, conv, q.data() + s.row0 * HK, s.n_tok, HK);
    short_conv(c, w.k_conv.data(), W, conv + win, k.data() + s.row0 * HK, s.n_tok, HK);
    short_conv(c, w.v_conv.data(), W, conv + 2 * win, v.data() + s.row0 * HK, s.n_tok, HK);
  }
  l2norm_scaled(q.data(), n_tok * H, K, 1e-6f, 1.f / std::sqrt(float(K)));
  l2norm_scaled(k.data(), n_tok * H, K, 1e-6f, 1.f);
  c.cb("kda_q", layer, q.data(), int64_t(q.size()));
  c.cb("kda_k", layer, k.data(), int64_t(k.size()));
  c.cb("kda_v", layer, v.data(), int64_t(v.size()));

  linear(c, w.b_proj, x, n_tok, bt);  // beta = sigmoid(.) in fp32, never rounded (MODEL.md §13 #16)
  for (float& b : bt) b = sigmoidf(b);
  linear(c, w.f_a_proj, x, n_tok, fa);
  linear(c, w.f_b_proj, fa.data(), n_tok, g);
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float A = std::exp(w.A_log[size_t(h)]);
      float* gh = &g[size_t(t * HK + h * K)];
      for (int64_t d = 0; d < K; ++d) {
        const float z = gh[d] + w.dt_bias[size_t(h * K + d)];
        if (cfg.kda.has_gate_lower_bound) {
          gh[d] = cfg.kda.gate_lower_bound * sigmoidf(A * z);
        } else {
          const float sp = z > 20.f ? z : std::log1p(std::exp(z));
          gh[d] = -A * sp;
        }
      }
    }
  c.cb("kda_beta", layer, bt.data(), int64_t(bt.size()));
  c.cb("kda_g", layer, g.data(), int64_t(g.size()));

  std::vector<float> o(size_t(n_tok * HK));
  if (c.par) {
    KdaParams all;
    all.n_tok = n_tok, all.n_head = int(H), all.d_k = all.d_v = int(K), all.chunk = ex.chunk;
    all.q = q.data(), all.k = k.data(), all.v = v.data(), all.g = g.data(), all.beta = bt.data();
    c.par->kda_initial_state(c, layer, seqs, all);
  }
  for (const KdaSeq& s : seqs) {
    KdaParams p;
    p.n_tok = s.n_tok;
    p.n_head = int(H);
    p.d_k = p.d_v = int(K);
    const size_t r = size_t(s.row0);
    p.q = &q[r * HK], p.k = &k[r * HK], p.v = &v[r * HK], p.g = &g[r * HK], p.beta = &bt[r * H];
    p.S = s.st->S.data();
    p.o = &o[r * HK];
    p.chunk = ex.chunk;
    if (ex.reference)
      kda_ref(p);
    else if (ex.recurrent || s.n_tok == 1)
      kda_recurrent_cpu(p, c.pool);
    else
      kda_chunk_cpu(p, c.pool);
  }
  c.rnd(o.data(), int64_t(o.size()));
  c.cb("kda_o", layer, o.data(), int64_t(o.size()));

  if (cfg.kda.full_rank_gate) {
    linear(c, w.g_proj, x, n_tok, gate);
  } else {
    linear(c, w.g_a_proj, x, n_tok, ga);
    linear(c, w.g_b_proj, ga.data(), n_tok, gate);
  }
  for (int64_t r = 0; r < n_tok * H; ++r) {  // FusedRMSNormGated(sigmoid), per head, fp32
    float* oh = &o[size_t(r * K)];
    const float* gh = &gate[size_t(r * K)];
    float ss = 0.f;
    for (int64_t d = 0; d < K; ++d) ss += oh[d] * oh[d];
    const float inv = 1.f / std::sqrt(ss / float(K) + cfg.rms_norm_eps);
    for (int64_t d = 0; d < K; ++d) oh[d] = oh[d] * inv * w.o_norm[size_t(d)] * sigmoidf(gh[d]);
  }
  c.rnd(o.data(), int64_t(o.size()));
  c.cb("kda_gated", layer, o.data(), int64_t(o.size()));
  linear_rowpar(c, w.o_proj, o.data(), n_tok, out);  // a partial sum when the heads are sharded
}

}  // namespace k3
