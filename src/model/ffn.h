// ffn.h: the GLU MLP used by dense layers, shared experts and routed experts (MODEL.md §8.1).
//
//   out = down(act(gate x, up x))
//   silu (KL):  h = bf16(silu(g) u)
//   situ (K3):  a = b1 tanh(g / b1) sigmoid(g);  b = b2 tanh(u / b2) (b = u without
//   activation_situ_linear_beta)
//               h = bf16(a b)                                           b1 = 4, b2 = 25 in the released
//               configs
// g and u are the bf16-rounded projection outputs; the activation itself runs in fp32.
#pragma once

#include <vector>

#include "k3/config.h"
#include "model/binder.h"
#include "model/common.h"

namespace k3 {

struct FfnWeights {
  LinearWeight gate_proj, up_proj;  // [d_ff, d_in]  (routed experts: w1, w3)
  LinearWeight down_proj;           // [d_in, d_ff]  (routed experts: w2)
  bool out_partial = false;         // d_ff sharded over ranks (tensor parallel): out is reduced (parallel.h)
};

// names: {"gate_proj", "up_proj", "down_proj"} or {"w1", "w3", "w2"}.
Status bind_ffn(Binder& b, const char* gate, const char* up, const char* down, int64_t d_in, int64_t d_ff,
                FfnWeights* w);
// g <- act(g, u) over n values (then the bf16 rounding point).
void glu_act(const Ctx& c, const ModelConfig& cfg, float* g, const float* u, int64_t n);
// x: [n_tok, d_in] -> out: [n_tok, d_in]
void ffn_forward(const Ctx& c, const ModelConfig& cfg, const FfnWeights& w, const float* x, int64_t n_tok,
                 float* out);

}  // namespace k3
