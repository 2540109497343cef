// kda_fast_gpu.cu: the KDA token mixer on the fast bf16 kernels (ops/kda_fast.h), bf16 mode, K = V = 128,
// conv width 4: the default there since session 8 (K3_KDA_FAST=0 turns it off, read when a sequence state is
// made; kda_gpu.cu is the generic path). The same equations, rounding points and trace names as kda_gpu.cu's
// generic path (model/kda.cpp, MODEL.md §4). The conv window is kept in bf16 (KdaStateGpu::conv16): exact,
// since the pre-conv rows q~, k~, v~ are a bf16 rounding point.
//
//   projections (linear, bf16 rounding point) for every row, then per sequence:
//   1 token   kda_decode_fast_cuda, all such sequences in one launch: conv + SiLU + roll, l2norm, gate, beta,
//             the recurrence step in place on S, o = bf16(S^T q), the gated RMSNorm -> y rows (fp32 inside,
//             no rounding point the CPU does not have); a decode step's kernel reads the projection rows
//             and writes y in place, with no gather, scatter or table launch (up to 8 sequences)
//   n tokens  conv over [bf16 window | rows] + roll, l2norm, beta = sigmoid, gate; then the generic exact
//             chunked recurrence on fp32 q^, k^, v, g, or with K3_KDA_FAST_PREFILL=1 kda_prefill_fast_cuda on
//             bf16 q^, k^, v, g (needs the lower-bounded gate g >= -5, K3 / K3.1; not the CPU's rounding
//             points: q^, k^ and g are fp32 there, so the state differs by ~1e-3 rel-RMS, docs/kda_cuda.md);
//             o -> gated RMSNorm -> y rows
//   out = o_proj y
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "ops/kda.h"
#include "ops/kda_fast.h"
#include "ops/l2norm.h"
#include "ops/sigmoid.h"

namespace k3::gpu {

namespace {

constexpr int K = 128, W = 4;

__device__ inline uint16_t to_bf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ inline float from_bf16(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}

// One-token sequences: their projection rows rows[s] gathered into the decode kernel's bf16 inputs.
struct PackArgs {
  const float *qt, *kt, *vt, *f, *b, *gate;  // [n_tok, HK] / b [n_tok, H]
  const int64_t* rows;                       // [nd]
  uint16_t *qkv, *f16, *b16, *gate16;        // [nd, 3, HK], [nd, HK], [nd, H], [nd, HK]
  int64_t nd, HK, H;
};
__global__ void pack_kernel(PackArgs a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.nd * a.HK) return;
  const int64_t s = i / a.HK, ch = i % a.HK, r = a.rows[s] * a.HK + ch;
  a.qkv[(s * 3 + 0) * a.HK + ch] = to_bf16(a.qt[r]);
  a.qkv[(s * 3 + 1) * a.HK + ch] = to_bf16(a.kt[r]);
  a.qkv[(s * 3 + 2) * a.HK + ch] = to_bf16(a.vt[r]);
  a.f16[i] = to_bf16(a.f[r]);
  a.gate16[i] = to_bf16(a.gate[r]);
  if (ch < a.H) a.b16[s * a.H + ch] = to_bf16(a.b[a.rows[s] * a.H + ch]);
}

// Host values to device memory through a kernel's parameters (a graph-capturable "upload" of a small table).
constexpr int kTab = 256;
struct Table {
  uint64_t v[kTab];
  int n;
};
__global__ void table_kernel(Table t, uint64_t* dst) {
  if (int(threadIdx.x) < t.n) dst[threadIdx.x] = t.v[threadIdx.x];
}

// The values to a new device array through table_kernel launches (no host memcpy: the step may be a graph).
Status upload_table(const GpuCtx& c, const std::vector<uint64_t>& h, DevBuf* out) {
  K3_RETURN_IF_ERROR(out->alloc_bytes(c, h.size() * 8));
  for (size_t i0 = 0; i0 < h.size(); i0 += kTab) {
    Table t;
    t.n = int(std::min(h.size() - i0, size_t(kTab)));
    std::copy_n(h.begin() + long(i0), t.n, t.v);
    table_kernel<<<1, kTab, 0, c.stream()>>>(t, out->as<uint64_t>() + i0);
  }
  return launch_status("kda state table");
}

// dst[rows[s], :] = src[s, :] (T = float or bf16 bits); rows == nullptr: dst[i] = src[i].
template <class T>
__global__ void scatter_rows_kernel(float* dst, const T* src, const int64_t* rows, int64_t n, int64_t d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * d) return;
  const float v = sizeof(T) == 2 ? from_bf16(uint16_t(src[i])) : float(src[i]);
  dst[rows ? rows[i / d] * d + i % d : i] = v;
}

// Short conv of one sequence's rows over [bf16 window (3 rows) | x rows], SiLU, bf16 (blockIdx.y = q / k /
// v).
struct ConvArgs {
  const float* x[3];
  float* y[3];
  const float* w[3];  // [HK, 4]
  uint16_t* win;      // [3, 3, HK]
  int64_t n, HK;
};
__global__ void conv16_kernel(ConvArgs a) {
  const int m = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n * a.HK) return;
  const int64_t t = i / a.HK, ch = i % a.HK;
  const uint16_t* win = a.win + m * 3 * a.HK;
  float acc = 0.f;
  for (int j = 0; j < W; ++j) {
    const int64_t r = t + j;
    const float v = r < W - 1 ? from_bf16(win[r * a.HK + ch]) : a.x[m][(r - (W - 1)) * a.HK + ch];
    acc += a.w[m][ch * W + j] * v;
  }
  a.y[m][i] = __bfloat162float(__float2bfloat16_rn(acc / (1.f + expf(-acc))));
}
// window <- the last 3 rows of [window | x] (row r reads row n + r >= r: ascending is safe).
__global__ void roll16_kernel(ConvArgs a) {
  const int m = blockIdx.y;
  const int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= a.HK) return;
  uint16_t* win = a.win + m * 3 * a.HK;
  for (int r = 0; r < W - 1; ++r) {
    const int64_t src = a.n + r;
    win[r * a.HK + ch] = src < W - 1 ? win[src * a.HK + ch] : to_bf16(a.x[m][(src - (W - 1)) * a.HK + ch]);
  }
}

// g <- gate(g + dt_bias) (K3: lb sigmoid(A z); KL: -A softplus(z)), A = exp(A_log[h]); rows of one sequence.
__global__ void gate16_kernel(float* g, const float* dt_bias, const float* A_log, int64_t n, int H,
                              bool lb_form, float lb) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * H * K) return;
  const int64_t hk = i % (int64_t(H) * K);
  const float A = expf(A_log[hk / K]), z = g[i] + dt_bias[hk];
  g[i] = lb_form ? lb * (1.f / (1.f + expf(-(A * z)))) : -A * (z > 20.f ? z : log1pf(expf(z)));
}

// q, k, v, g rows (fp32, q^ k^ normalized) -> bf16 for the prefill kernel (blockIdx.y picks the array).
struct Bf16Args {
  const float* src[4];
  uint16_t* dst[4];
  int64_t n;
};
__global__ void to_bf16_kernel(Bf16Args a) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < a.n) a.dst[blockIdx.y][i] = to_bf16(a.src[blockIdx.y][i]);
}

// One warp per (token, head): y = o rsqrt(mean(o^2) + eps) w sigmoid(gate), bf16.
__global__ void gated_norm16_kernel(const float* o, const float* gate, const float* w, float* y,
                                    int64_t n_row, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n_row) return;
  const float *oh = o + row * K, *gh = gate + row * K;
  float ss = 0.f;
  for (int d = lane; d < K; d += 32) ss += oh[d] * oh[d];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = 1.f / sqrtf(ss / float(K) + eps);
  for (int d = lane; d < K; d += 32)
    y[row * K + d] = __bfloat162float(__float2bfloat16_rn(oh[d] * inv * w[d] * (1.f / (1.f + expf(-gh[d])))));
}

}  // namespace

Status kda_forward_fast_gpu(const GpuCtx& c, const ModelConfig& cfg, const KdaWeightsGpu& w,
                            const KdaExec& ex, std::span<const KdaSeqGpu> seqs, const float* x, int64_t n_tok,
                            float* out, int layer) {
  const int64_t H = cfg.kda.n_head, HK = H * K;
#ifdef NDEBUG
  const bool tracing = c.trace && *c.trace;
#else
  const bool tracing = true;  // debug builds check every traced array for NaN/Inf: all rows must be written
#endif
  const bool lb_form = cfg.kda.has_gate_lower_bound;
  const bool fast_prefill = env_switch("K3_KDA_FAST_PREFILL", false) && lb_form &&
                            cfg.kda.gate_lower_bound >= -5.f && !ex.recurrent;
  DevBuf qt, kt, vt, q, k, v, bt, g, o, y, gate;
  for (DevBuf* b : {&qt, &kt, &vt, &q, &k, &v, &g, &o, &y, &gate})
    K3_RETURN_IF_ERROR(b->alloc(c, n_tok * HK));
  K3_RETURN_IF_ERROR(bt.alloc(c, n_tok * H));
  K3_RETURN_IF_ERROR(kda_project_gpu(c, cfg, w, x, n_tok, qt.f(), kt.f(), vt.f(), bt.f(), g.f(), gate.f()));

  // One-token sequences: one fused launch over all of them. A decode step (every row a one-token sequence,
  // so row s is sequence s) hands the kernel the projection rows and y as they are (x32 / out32) and, for
  // up to kKdaInlineSeq sequences, the state pointers in its parameters; otherwise (a mixed batch, or more
  // sequences) a small device table first, and a mixed batch's rows gathered into bf16 and scattered back.
  std::vector<int64_t> rows;
  std::vector<float*> Sp;
  std::vector<uint16_t*> Cp;
  for (const KdaSeqGpu& s : seqs)
    if (s.n_tok == 1) rows.push_back(s.row0), Sp.push_back(s.st->S), Cp.push_back(s.st->conv16);
  const int64_t nd = int64_t(rows.size());
  if (nd > 0) {
    static const bool direct_on = env_switch("K3_KDA_DIRECT", true);  // =0: pack, table and scatter always
    const bool direct = direct_on && nd == n_tok;
    const bool inlined = direct && !tracing && nd <= KdaDecodeParams::kKdaInlineSeq;
    KdaDecodeParams p;
    p.n_seq = int(nd), p.n_head = int(H);
    p.conv_w = w.q_conv, p.conv_w_k = w.k_conv, p.conv_w_v = w.v_conv;
    p.dt_bias = w.dt_bias, p.A_log = w.A_log, p.o_norm = w.o_norm, p.eps = cfg.rms_norm_eps;
    p.softplus_gate = !lb_form, p.g_lower = cfg.kda.gate_lower_bound;
    DevBuf tab, qkv16, f16, b16, gate16, out16, dbg;
    const int64_t* drows = nullptr;  // [nd] device rows (the table), when one was made
    if (inlined) {
      for (int64_t i = 0; i < nd; ++i) p.S_inline[i] = Sp[size_t(i)], p.conv_inline[i] = Cp[size_t(i)];
    } else {
      std::vector<uint64_t> t(size_t(3 * nd));
      for (int64_t i = 0; i < nd; ++i) {
        t[size_t(i)] = uint64_t(rows[size_t(i)]);
        t[size_t(nd + i)] = reinterpret_cast<uint64_t>(Sp[size_t(i)]);
        t[size_t(2 * nd + i)] = reinterpret_cast<uint64_t>(Cp[size_t(i)]);
      }
      K3_RETURN_IF_ERROR(upload_table(c, t, &tab));
      drows = tab.as<int64_t>();
      p.S_seq = reinterpret_cast<float* const*>(tab.as<uint64_t>() + nd);
      p.conv_seq = reinterpret_cast<uint16_t* const*>(tab.as<uint64_t>() + 2 * nd);
    }
    if (direct) {
      p.x32[0] = qt.f(), p.x32[1] = kt.f(), p.x32[2] = vt.f(), p.x32[3] = g.f(), p.x32[4] = gate.f();
      p.x32[5] = bt.f(), p.out32 = y.f();
    } else {
      K3_RETURN_IF_ERROR(qkv16.alloc_bytes(c, size_t(nd * 3 * HK) * 2));
      K3_RETURN_IF_ERROR(f16.alloc_bytes(c, size_t(nd * HK) * 2));
      K3_RETURN_IF_ERROR(gate16.alloc_bytes(c, size_t(nd * HK) * 2));
      K3_RETURN_IF_ERROR(out16.alloc_bytes(c, size_t(nd * HK) * 2));
      K3_RETURN_IF_ERROR(b16.alloc_bytes(c, size_t(nd * H) * 2));
      PackArgs pa{qt.f(),
                  kt.f(),
                  vt.f(),
                  g.f(),
                  bt.f(),
                  gate.f(),
                  drows,
                  qkv16.as<uint16_t>(),
                  f16.as<uint16_t>(),
                  b16.as<uint16_t>(),
                  gate16.as<uint16_t>(),
                  nd,
                  HK,
                  H};
      pack_kernel<<<blocks_for(nd * HK), kThreads, 0, c.stream()>>>(pa);
      p.qkv = qkv16.as<uint16_t>(), p.f = f16.as<uint16_t>(), p.b = b16.as<uint16_t>();
      p.gate = gate16.as<uint16_t>(), p.out = out16.as<uint16_t>();
    }
    if (tracing) {  // the intermediates, scattered into the full arrays below
      K3_RETURN_IF_ERROR(dbg.alloc(c, nd * (5 * HK + H)));
      p.q_out = dbg.f(), p.k_out = p.q_out + nd * HK, p.v_out = p.k_out + nd * HK,
      p.g_out = p.v_out + nd * HK;
      p.o_out = p.g_out + nd * HK, p.beta_out = p.o_out + nd * HK;
    }
    K3_RETURN_IF_ERROR(kda_decode_fast_cuda(p, *c.g));
    const unsigned nb = blocks_for(nd * HK);
    if (!direct) scatter_rows_kernel<uint16_t><<<nb, kThreads, 0, c.stream()>>>(y.f(), p.out, drows, nd, HK);
    if (tracing) {  // (x32 read bt and g: the traced beta and g go in after the kernel)
      const std::pair<float*, const float*> to[] = {
          {q.f(), p.q_out}, {k.f(), p.k_out}, {v.f(), p.v_out}, {g.f(), p.g_out}, {o.f(), p.o_out}};
      for (const auto& [dst, src] : to)
        scatter_rows_kernel<float><<<nb, kThreads, 0, c.stream()>>>(dst, src, drows, nd, HK);
      scatter_rows_kernel<float>
          <<<blocks_for(nd * H), kThreads, 0, c.stream()>>>(bt.f(), p.beta_out, drows, nd, H);
    }
  }

  // Multi-token sequences, one at a time: conv, norms, gates, then the chunked kernel.
  for (const KdaSeqGpu& s : seqs) {
    if (s.n_tok <= 1) continue;
    const int64_t r = s.row0 * HK, n = s.n_tok;
    ConvArgs a{{qt.f() + r, kt.f() + r, vt.f() + r},
               {q.f() + r, k.f() + r, v.f() + r},
               {w.q_conv, w.k_conv, w.v_conv},
               s.st->conv16,
               n,
               HK};
    conv16_kernel<<<dim3(blocks_for(n * HK), 3), kThreads, 0, c.stream()>>>(a);
    roll16_kernel<<<dim3(blocks_for(HK), 3), kThreads, 0, c.stream()>>>(a);
    L2NormParams lq;
    lq.n_row = n, lq.n_head = H, lq.d_head = K, lq.x = lq.y = q.f() + r, lq.eps = 1e-6f;
    lq.scale = 1.f / std::sqrt(float(K));
    l2norm_cuda(lq, *c.g);
    L2NormParams lk = lq;
    lk.x = lk.y = k.f() + r, lk.scale = 1.f;
    l2norm_cuda(lk, *c.g);
    SigmoidParams sp;  // beta = sigmoid(.) in fp32, never rounded (MODEL.md §13 #16)
    sp.n_row = n, sp.d = H, sp.x = sp.y = bt.f() + s.row0 * H;
    sigmoid_cuda(sp, *c.g);
    gate16_kernel<<<blocks_for(n * HK), kThreads, 0, c.stream()>>>(g.f() + r, w.dt_bias, w.A_log, n, int(H),
                                                                   lb_form, cfg.kda.gate_lower_bound);
    bool done = false;
    if (fast_prefill) {
      DevBuf in16, o16, cu;
      K3_RETURN_IF_ERROR(in16.alloc_bytes(c, size_t(4 * n * HK) * 2));
      K3_RETURN_IF_ERROR(o16.alloc_bytes(c, size_t(n * HK) * 2));
      K3_RETURN_IF_ERROR(cu.alloc_bytes(c, 8));
      const int cuh[2] = {0, int(n)};
      K3_CUDA_CHECK(cudaMemcpyAsync(cu.f(), cuh, 8, cudaMemcpyHostToDevice, c.stream()));
      uint16_t* b16p = in16.as<uint16_t>();
      Bf16Args ba{{q.f() + r, k.f() + r, v.f() + r, g.f() + r},
                  {b16p, b16p + n * HK, b16p + 2 * n * HK, b16p + 3 * n * HK},
                  n * HK};
      to_bf16_kernel<<<dim3(blocks_for(n * HK), 4), kThreads, 0, c.stream()>>>(ba);
      KdaPrefillParams pp;
      pp.n_seq = 1, pp.n_tok = n, pp.n_head = int(H), pp.cu_seqlens = cu.as<int>();
      pp.q = ba.dst[0], pp.k = ba.dst[1], pp.v = ba.dst[2], pp.g = ba.dst[3], pp.beta = bt.f() + s.row0 * H;
      pp.S = s.st->S, pp.o = o16.as<uint16_t>();
      if (kda_prefill_fast_cuda(pp, *c.g).ok()) {  // else (e.g. too small a workspace): the generic kernel
        scatter_rows_kernel<uint16_t>
            <<<blocks_for(n * HK), kThreads, 0, c.stream()>>>(o.f() + r, pp.o, nullptr, n * HK, 1);
        done = true;
      }
    }
    if (!done) {
      KdaParams p;
      p.n_tok = n, p.n_head = int(H), p.d_k = p.d_v = K, p.chunk = ex.chunk;
      p.q = q.f() + r, p.k = k.f() + r, p.v = v.f() + r, p.g = g.f() + r, p.beta = bt.f() + s.row0 * H;
      p.S = s.st->S, p.o = o.f() + r;
      if (ex.recurrent)
        kda_recurrent_cuda(p, *c.g);
      else
        kda_chunk_cuda(p, *c.g);
      c.rnd(o.f() + r, n * HK);
    }
    gated_norm16_kernel<<<blocks_for(n * H * 32), kThreads, 0, c.stream()>>>(
        o.f() + r, gate.f() + r, w.o_norm, y.f() + r, n * H, cfg.rms_norm_eps);
  }
  c.cb("kda_q", layer, q.f(), n_tok * HK);
  c.cb("kda_k", layer, k.f(), n_tok * HK);
  c.cb("kda_v", layer, v.f(), n_tok * HK);
  c.cb("kda_beta", layer, bt.f(), n_tok * H);
  c.cb("kda_g", layer, g.f(), n_tok * HK);
  c.cb("kda_o", layer, o.f(), n_tok * HK);
  c.cb("kda_gated", layer, y.f(), n_tok * HK);
  linear(c, w.o_proj, y.f(), n_tok, out);
  return launch_status("kda layer (fast)");
}

}  // namespace k3::gpu
