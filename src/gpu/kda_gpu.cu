// kda_gpu.cu: the KDA token mixer on the GPU (model/kda.cpp, MODEL.md §4).
//
//   q~,k~,v~ = {q,k,v}_proj x                         (bf16 rounding point)
//   q,k,v    = SiLU(causal depthwise conv_W over [conv state | new rows])   rolling window kept per sequence
//   q^ = l2norm(q) K^-1/2, k^ = l2norm(k);  beta = sigmoid(b_proj x) (fp32)
//   g = -exp(A_log) softplus(f_b f_a x + dt_bias) (KL)  |  lb sigmoid(exp(A_log)(f_b f_a x + dt_bias)) (K3)
//   o = KDA(q^, k^, v, g, beta; S)                    ops/kda.h (chunkwise for prefill, recurrent for 1
//   token) y_h = o_h rsqrt(mean(o_h^2) + eps) w_onorm sigmoid(gate_h);  out = o_proj y
// This file is the generic exact path (fp32 mode, any head size, or K3_KDA_FAST=0); bf16 mode with K = V =
// 128 and conv width 4 runs kda_fast_gpu.cu (the fused decode kernel of ops/kda_fast.h; its prefill kernel is
// opt-in there).
#include <cmath>

#include "gpu/blocks_gpu.cuh"
#include "ops/cuda_util.cuh"
#include "ops/kda.h"
#include "ops/l2norm.h"
#include "ops/sigmoid.h"

namespace k3::gpu {

namespace {

// y[t, ch] = SiLU(sum_j w[ch, j] win[t + j, ch]), win = [state (W-1 rows) | x (n_tok rows)]; blockIdx.y picks
// q / k / v (x, y, state, w advance by the given strides).
struct ConvArgs {
  const float* x[3];
  float* y[3];
  const float* state[3];
  const float* w[3];
  int64_t n_tok, C;
  int W;
  bool bf16;
};

__global__ void short_conv_kernel(ConvArgs a) {
  const int which = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tok * a.C) return;
  const int64_t t = i / a.C, ch = i % a.C;
  const float* x = a.x[which];
  const float* st = a.state[which];
  const float* w = a.w[which];
  float acc = 0.f;
  for (int j = 0; j < a.W; ++j) {
    const int64_t r = t + j;  // window row
    const float v = r < a.W - 1 ? st[r * a.C + ch] : x[(r - (a.W - 1)) * a.C + ch];
    acc += w[ch * a.W + j] * v;
  }
  float y = acc / (1.f + expf(-acc));
  if (a.bf16) y = round_bf16_dev(y);
  a.y[which][t * a.C + ch] = y;
}

// state <- the last W-1 rows of [state | x], in place (row r reads row n_tok + r >= r: ascending is safe).
__global__ void conv_state_kernel(ConvArgs a, float* s0, float* s1, float* s2) {
  const int which = blockIdx.y;
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= a.C) return;
  float* st = which == 0 ? s0 : (which == 1 ? s1 : s2);
  const float* x = a.x[which];
  for (int r = 0; r < a.W - 1; ++r) {
    const int64_t src = a.n_tok + r;
    st[r * a.C + ch] = src < a.W - 1 ? st[src * a.C + ch] : x[(src - (a.W - 1)) * a.C + ch];
  }
}

// g[t, h*K + d] <- gate(g + dt_bias) with A = exp(A_log[h]).
__global__ void gate_kernel(float* g, const float* dt_bias, const float* A_log, int64_t n_tok, int H, int K,
                            bool lower_bound, float lb) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t HK = int64_t(H) * K;
  if (i >= n_tok * HK) return;
  const int64_t hk = i % HK;
  const float A = expf(A_log[hk / K]);
  const float z = g[i] + dt_bias[hk];
  if (lower_bound) {
    g[i] = lb * (1.f / (1.f + expf(-(A * z))));
  } else {
    const float sp = z > 20.f ? z : log1pf(expf(z));
    g[i] = -A * sp;
  }
}

// One warp per (token, head) row of K: o <- o rsqrt(mean(o^2) + eps) w sigmoid(gate), then the bf16
// rounding point when bf16.
__global__ void gated_norm_kernel(float* o, const float* gate, const float* w, int64_t n_row, int K,
                                  float eps, bool bf16) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_row) return;
  float* oh = o + row * K;
  const float* gh = gate + row * K;
  float ss = 0.f;
  for (int d = lane; d < K; d += 32) ss += oh[d] * oh[d];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = 1.f / sqrtf(ss / float(K) + eps);
  for (int d = lane; d < K; d += 32) {
    const float y = oh[d] * inv * w[d] * (1.f / (1.f + expf(-gh[d])));
    oh[d] = bf16 ? round_bf16_dev(y) : y;
  }
}

}  // namespace

// kda_fast_gpu.cu: the same layer on the fast bf16 kernels (states made with a bf16 conv window).
Status kda_forward_fast_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w, const KdaExec& ex,
                            std::span<const KdaSeqGpu> seqs, const float* x, int64_t n_tok, float* out,
                            int layer);

Status kda_project_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w, const float* x,
                       int64_t n_tok, float* qt, float* kt, float* vt, float* bt, float* g, float* gate) {
  DevBuf fa, ga;
  K3_RETURN_IF_ERROR(fa.alloc(c, n_tok * w.f_a_proj.out));
  const bool full_gate = cfg.kda.full_rank_gate;
  if (!full_gate) K3_RETURN_IF_ERROR(ga.alloc(c, n_tok * w.g_a_proj.out));
  const LinearOut gate_out = full_gate ? LinearOut{&w.g_proj, gate} : LinearOut{&w.g_a_proj, ga.f()};
  linear_group(c, {{&w.q_proj, qt}, {&w.k_proj, kt}, {&w.v_proj, vt}, {&w.b_proj, bt}, {&w.f_a_proj, fa.f()}, gate_out},
               x, n_tok);
  linear(c, w.f_b_proj, fa.f(), n_tok, g);
  if (!full_gate) linear(c, w.g_b_proj, ga.f(), n_tok, gate);
  return launch_status("kda projections");
}

Status kda_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w, const KdaExec& ex,
                       std::span<const KdaSeqGpu> seqs, const float* x, int64_t n_tok, float* out,
                       int layer) {
  if (!seqs.empty() && seqs[0].st->conv16)  // bf16, K = V = 128, W = 4 (state_gpu.cu decides)
    return kda_forward_fast_gpu(c, cfg, w, ex, seqs, x, n_tok, out, layer);
  const int64_t H = cfg.kda.n_head, K = cfg.kda.d_head, HK = H * K;
  const int W = cfg.kda.conv_size;
  DevBuf qt, kt, vt, q, k, v, bt, g, o, gate;
  for (DevBuf* b : {&qt, &kt, &vt, &q, &k, &v, &g, &o, &gate}) K3_RETURN_IF_ERROR(b->alloc(c, n_tok * HK));
  K3_RETURN_IF_ERROR(bt.alloc(c, n_tok * H));
  K3_RETURN_IF_ERROR(kda_project_gpu(c, cfg, w, x, n_tok, qt.f(), kt.f(), vt.f(), bt.f(), g.f(), gate.f()));
  const int64_t win = int64_t(W - 1) * HK;
  for (const KdaSeqGpu& s : seqs) {
    if (s.n_tok <= 0) continue;
    ConvArgs a;
    float* conv = s.st->conv;
    const int64_t r = s.row0 * HK;
    const float* xs[3] = {qt.f() + r, kt.f() + r, vt.f() + r};
    float* ys[3] = {q.f() + r, k.f() + r, v.f() + r};
    const float* ws[3] = {w.q_conv, w.k_conv, w.v_conv};
    for (int j = 0; j < 3; ++j) a.x[j] = xs[j], a.y[j] = ys[j], a.state[j] = conv + j * win, a.w[j] = ws[j];
    a.n_tok = s.n_tok, a.C = HK, a.W = W, a.bf16 = c.bf16();
    short_conv_kernel<<<dim3(blocks_for(s.n_tok * HK), 3), kThreads, 0, c.stream()>>>(a);
    conv_state_kernel<<<dim3(blocks_for(HK), 3), kThreads, 0, c.stream()>>>(a, conv, conv + win,
                                                                            conv + 2 * win);
  }
  L2NormParams lq;
  lq.n_row = n_tok, lq.n_head = H, lq.d_head = K, lq.x = q.f(), lq.y = q.f(), lq.eps = 1e-6f;
  lq.scale = 1.f / std::sqrt(float(K));
  l2norm_cuda(lq, *c.g);
  L2NormParams lk = lq;
  lk.x = lk.y = k.f(), lk.scale = 1.f;
  l2norm_cuda(lk, *c.g);
  c.cb("kda_q", layer, q.f(), n_tok * HK);
  c.cb("kda_k", layer, k.f(), n_tok * HK);
  c.cb("kda_v", layer, v.f(), n_tok * HK);

  SigmoidParams sp;
  sp.n_row = n_tok, sp.d = H, sp.x = bt.f(), sp.y = bt.f();
  sigmoid_cuda(sp, *c.g);
  gate_kernel<<<blocks_for(n_tok * HK), kThreads, 0, c.stream()>>>(g.f(), w.dt_bias, w.A_log, n_tok, int(H),
                                                                   int(K), cfg.kda.has_gate_lower_bound,
                                                                   cfg.kda.gate_lower_bound);
  c.cb("kda_beta", layer, bt.f(), n_tok * H);
  c.cb("kda_g", layer, g.f(), n_tok * HK);

  for (const KdaSeqGpu& s : seqs) {
    if (s.n_tok <= 0) continue;
    KdaParams p;
    p.n_tok = s.n_tok;
    p.n_head = int(H);
    p.d_k = p.d_v = int(K);
    const int64_t r = s.row0 * HK;
    p.q = q.f() + r, p.k = k.f() + r, p.v = v.f() + r, p.g = g.f() + r, p.beta = bt.f() + s.row0 * H;
    p.S = s.st->S;
    p.o = o.f() + r;
    p.chunk = ex.chunk;
    if (ex.recurrent || s.n_tok == 1)
      kda_recurrent_cuda(p, *c.g);
    else
      kda_chunk_cuda(p, *c.g);
  }
  c.rnd(o.f(), n_tok * HK);
  c.cb("kda_o", layer, o.f(), n_tok * HK);

  const int64_t n_row = n_tok * H;
  gated_norm_kernel<<<blocks_for(n_row * 32), kThreads, 0, c.stream()>>>(o.f(), gate.f(), w.o_norm, n_row,
                                                                         int(K), cfg.rms_norm_eps, c.bf16());
  c.cb("kda_gated", layer, o.f(), n_tok * HK);
  linear(c, w.o_proj, o.f(), n_tok, out);
  return launch_status("kda layer");
}

}  // namespace k3::gpu
