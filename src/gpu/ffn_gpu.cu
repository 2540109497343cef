// ffn_gpu.cu: the GLU MLP on the GPU (model/ffn.cpp, MODEL.md §8.1): dense layers, shared and routed experts.
//
//   g = bf16(gate x);  u = bf16(up x);  h = bf16(act(g, u))   silu (KL) | situ (K3), fp32 inside (ops/glu.h)
//   out = bf16(down h)
#include "gpu/blocks_gpu.cuh"
#include "ops/glu.h"

namespace k3::gpu {

Status ffn_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const FfnWeights& w, const float* x,
                       int64_t n_tok, float* out, float* gu) {
  if (n_tok <= 0) return ok_status();
  const int64_t d_ff = w.gate_proj.out;
  DevBuf g_buf, u_buf;
  float *g = gu, *u = gu ? gu + n_tok * d_ff : nullptr;
  if (!gu) {
    K3_RETURN_IF_ERROR(g_buf.alloc(c, n_tok * d_ff));
    K3_RETURN_IF_ERROR(u_buf.alloc(c, n_tok * d_ff));
    g = g_buf.f(), u = u_buf.f();
  }
  linear_group(c, {{&w.gate_proj, g}, {&w.up_proj, u}}, x, n_tok);
  GluParams p;
  p.kind = cfg.act == Activation::silu ? GluKind::silu : GluKind::situ;
  p.n_tok = n_tok, p.d = d_ff;
  p.g = g, p.u = u, p.h = g;
  p.beta1 = cfg.situ_beta;
  p.beta2 = cfg.has_situ_linear_beta ? cfg.situ_linear_beta : 0.f;
  p.precision = c.prec;
  glu_cuda(p, *c.g);
  linear(c, w.down_proj, g, n_tok, out);
  return launch_status("ffn");
}

}  // namespace k3::gpu
