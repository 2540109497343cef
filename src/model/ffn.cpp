// ffn.cpp: GLU MLP (ffn.h, MODEL.md §8.1).
#include "model/ffn.h"

#include <cmath>

namespace k3 {

Status bind_ffn(Binder& b, const char* gate, const char* up, const char* down, int64_t d_in, int64_t d_ff,
                FfnWeights* w) {
  w->gate_proj = b.linear(gate, d_ff, d_in);
  w->up_proj = b.linear(up, d_ff, d_in);
  w->down_proj = b.linear(down, d_in, d_ff);
  return b.status();
}

void glu_act(const Ctx& c, const ModelConfig& cfg, float* g, const float* u, int64_t n) {
  if (cfg.act == Activation::silu) {
    for (int64_t i = 0; i < n; ++i) g[i] = siluf(g[i]) * u[i];
  } else {
    const float b1 = cfg.situ_beta, b2 = cfg.situ_linear_beta;
    for (int64_t i = 0; i < n; ++i) {
      const float a = b1 * std::tanh(g[i] / b1) * sigmoidf(g[i]);
      const float b = cfg.has_situ_linear_beta ? b2 * std::tanh(u[i] / b2) : u[i];
      g[i] = a * b;
    }
  }
  c.rnd(g, n);
}

void ffn_forward(const Ctx& c, const ModelConfig& cfg, const FfnWeights& w, const float* x, int64_t n_tok,
                 float* out) {
  std::vector<float> g, u;
  linear(c, w.gate_proj, x, n_tok, g);
  linear(c, w.up_proj, x, n_tok, u);
  glu_act(c, cfg, g.data(), u.data(), int64_t(g.size()));
  if (w.out_partial)
    linear_rowpar(c, w.down_proj, g.data(), n_tok, out);
  else
    linear_into(c, w.down_proj, g.data(), n_tok, out);
}

}  // namespace k3
