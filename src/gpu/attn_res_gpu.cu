// attn_res_gpu.cu: Block Attention Residuals on the GPU (model/attn_res.cpp, MODEL.md §7).
//
//   V = [B_0, ..., B_{n-1}, p];  s_i = (q . V_i) rsqrt(mean_d(V_i^2) + eps);  alpha = softmax_i(s)
//   out = bf16(sum_i alpha_i V_i)                                   per token, fp32 inside
// One block per token; the n source pointers (n = finished blocks + 1, at most kMaxSources) travel by value.
//
// attn_res_norm_gpu: the mix and the RMSNorm that follows it (the layer's input norm) in one kernel, for up
// to kFastSources sources: one pass over the sources for every dot product and sum of squares (one block
// reduction of 2n values instead of 2n in turn), then the mix, its sum of squares and the norm:
//   a = mix (rounding as above);  y = RMSNorm(a; w) with rms_norm.h's rounding points
// At one token the model's norms were single-CTA kernels with 2n dependent reductions (session 6). Default
// since session 7 (H200: every GPU test and the K3 slice's GPU = CPU checks pass with it; the slice's norm
// module at B = 1, T = 4K 0.355 -> 0.250 ms); K3_ATTN_RES_NORM_FUSED=0 runs the mix kernel and rms_norm.
//
// Few tokens (decode): one CTA per token leaves all but n_tok SMs idle while one SM streams n rows of
// d_model floats. attn_res_cluster_kernel gives each token a cluster of kCluster CTAs, each owning a slice
// of d_model (one float4 of every source per thread, held in registers from the one read): block partials
// of (q . V_i, V_i . V_i) and later of a . a are exchanged through distributed shared memory and summed in
// rank order, so every CTA of a cluster derives bit-identical scores and r; then each mixes and normalizes
// its own slice. Same equations and rounding points; only the fp32 summation order differs. Used while
// n_tok is within a couple of waves of clusters (cluster_fits); K3_NORM_CLUSTER=0 keeps the kernels above.
//
// Every kernel can first settle a residual add owed to the partial sum (ResidualAdd, the last source):
// p <- round(p + o), written back, each element by the thread that reads it afterwards. This saves the
// add kernel between a sub-layer and the next norm (at one token, a launch and a dependent step each).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "ops/cuda_util.cuh"

namespace k3::gpu {

namespace {

constexpr int kMaxSources = 64;
constexpr int kMixThreads = 256;

struct Sources {
  const float* v[kMaxSources];
  int n;
  float* acc;        // ResidualAdd::p (= v[n - 1]) or null
  const float* add;  // ResidualAdd::o
};

__device__ __forceinline__ float round_if(float x, bool bf16) {
  return bf16 ? round_bf16_dev(x) : x;
}

// The owed add for token t, by the stride-loop threads (d = threadIdx.x, += blockDim.x) that read p later.
__device__ void settle_add(const Sources& s, int64_t t, int64_t D, bool bf16) {
  if (!s.acc) return;
  float* p = s.acc + t * D;
  const float* o = s.add + t * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) p[d] = round_if(p[d] + o[d], bf16);
}

__device__ float block_sum(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) s += red[i];
  return s;
}

__global__ void attn_res_kernel(Sources src, const float* q, float eps, int64_t D, float* out, bool bf16) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  __shared__ float red[kMixThreads / 32];
  __shared__ float score[kMaxSources];
  const int64_t t = blockIdx.x;
  settle_add(src, t, D, bf16);
  for (int i = 0; i < src.n; ++i) {
    const float* v = src.v[i] + t * D;
    float dot = 0.f, ss = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      dot += q[d] * v[d];
      ss += v[d] * v[d];
    }
    dot = block_sum(dot, red);
    ss = block_sum(ss, red);
    if (threadIdx.x == 0) score[i] = dot / sqrtf(ss / float(D) + eps);
  }
  __syncthreads();
  float m = -INFINITY, z = 0.f;
  for (int i = 0; i < src.n; ++i) m = fmaxf(m, score[i]);
  for (int i = 0; i < src.n; ++i) z += expf(score[i] - m);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int i = 0; i < src.n; ++i) o += (expf(score[i] - m) / z) * src.v[i][t * D + d];
    out[t * D + d] = bf16 ? round_bf16_dev(o) : o;
  }
}

constexpr int kFastSources = 16;
constexpr int kNormThreads = 512;

__global__ void __launch_bounds__(kNormThreads)
    attn_res_norm_kernel(Sources src, const float* q, float eps, int64_t D, const float* w, float* a,
                         float* y, bool bf16) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  __shared__ float red[kNormThreads / 32][2 * kFastSources];
  __shared__ float tot[2 * kFastSources + 1];
  const int64_t t = blockIdx.x;
  const int n = src.n, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  settle_add(src, t, D, bf16);
  float dot[kFastSources], ss[kFastSources];
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) dot[i] = 0.f, ss[i] = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {
    const float qd = q[d];
#pragma unroll
    for (int i = 0; i < kFastSources; ++i) {
      if (i >= n) break;
      const float v = src.v[i][t * D + d];
      dot[i] += qd * v;
      ss[i] += v * v;
    }
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    const float sd = cuda_ops::warp_sum(dot[i]), sv = cuda_ops::warp_sum(ss[i]);
    if (lane == 0) red[warp][2 * i] = sd, red[warp][2 * i + 1] = sv;
  }
  __syncthreads();
  if (int(threadIdx.x) < 2 * n) {
    float s = 0.f;
    for (int k = 0; k < kNormThreads / 32; ++k) s += red[k][threadIdx.x];
    tot[threadIdx.x] = s;
  }
  __syncthreads();
  float score[kFastSources], m = -INFINITY, z = 0.f;
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    score[i] = tot[2 * i] / sqrtf(tot[2 * i + 1] / float(D) + eps);
    m = fmaxf(m, score[i]);
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    z += expf(score[i] - m);
  }
  float ssa = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < kFastSources; ++i) {
      if (i >= n) break;
      o += (expf(score[i] - m) / z) * src.v[i][t * D + d];
    }
    o = bf16 ? round_bf16_dev(o) : o;
    a[t * D + d] = o;
    ssa += o * o;
  }
  ssa = cuda_ops::warp_sum(ssa);
  __syncthreads();  // tot is read by every thread above
  if (lane == 0) red[warp][0] = ssa;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < kNormThreads / 32; ++k) s += red[k][0];
    tot[2 * kFastSources] = s;
  }
  __syncthreads();
  const float r = 1.0f / sqrtf(tot[2 * kFastSources] / float(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {  // this thread's own a values
    const float x = a[t * D + d], wd = w ? w[d] : 1.f;
    y[t * D + d] = cuda_ops::rms_norm_out(x, r, wd, w, bf16);
  }
}

// ---- cluster path: one cluster of kCluster CTAs per token, each CTA a slice of d_model ----

constexpr int kCluster = 8;           // CTAs per token (the portable cluster size: no opt-in attribute)
constexpr int kClusterThreads = 512;  // most threads a CTA gets: one float4 per thread, d_model <= 16384
constexpr int kClusterTokPerSm = 2;   // cluster path while n_tok <= 2 * SMs (at most 16 CTAs per SM)

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Grid: n_tok * kCluster CTAs of round_up(ceil(D / 4 / kCluster), 32) threads. Thread j of cluster rank c
// owns columns [d, d + 4), d = 4 (c * per + j). kNorm: also y = RMSNorm(a; w) as in attn_res_norm_kernel.
template <bool kNorm>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kClusterThreads)
    attn_res_cluster_kernel(Sources src, const float* q, float eps, int64_t D, const float* w, float* a,
                            float* y, bool bf16) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ float red[kClusterThreads / 32][2 * kFastSources];
  __shared__ float part[2 * kFastSources];  // this CTA's (dot_i, ss_i) partials, read by the whole cluster
  __shared__ float part_a;                  // this CTA's partial a . a, read by the whole cluster
  __shared__ float tot[2 * kFastSources];
  const int n = src.n, warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warp = blockDim.x / 32;
  const int64_t t = blockIdx.x / kCluster, per = (D / 4 + kCluster - 1) / kCluster;
  const int64_t d = 4 * (int64_t(cluster.block_rank()) * per + threadIdx.x);
  const bool live = threadIdx.x < per && d < D;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);

  // Every load issued before any is used: one memory round trip per CTA.
  const float4 qd = live ? load4(q + d) : zero;
  const float4 wd = kNorm && live && w ? load4(w + d) : make_float4(1.f, 1.f, 1.f, 1.f);
  float4 v[kFastSources];
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    v[i] = live ? load4(src.v[i] + t * D + d) : zero;
  }
  if (src.acc && live) {  // the owed residual add, on this thread's float4 of the partial sum
    const float4 o = load4(src.add + t * D + d);
    float4& p = v[n - 1];
    p = make_float4(round_if(p.x + o.x, bf16), round_if(p.y + o.y, bf16), round_if(p.z + o.z, bf16),
                    round_if(p.w + o.w, bf16));
    store4(src.acc + t * D + d, p);
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    const float sd = cuda_ops::warp_sum(dot4(qd, v[i])), sv = cuda_ops::warp_sum(dot4(v[i], v[i]));
    if (lane == 0) red[warp][2 * i] = sd, red[warp][2 * i + 1] = sv;
  }
  __syncthreads();
  if (int(threadIdx.x) < 2 * n) {  // blockDim >= 32 >= 2n
    float s = 0.f;
    for (int k = 0; k < n_warp; ++k) s += red[k][threadIdx.x];
    part[threadIdx.x] = s;
  }
  cluster.sync();  // every CTA's part is written (release / acquire at cluster scope)
  if (int(threadIdx.x) < 2 * n) {
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) s += *cluster.map_shared_rank(&part[threadIdx.x], r);  // rank order
    tot[threadIdx.x] = s;
  }
  if constexpr (!kNorm) cluster.barrier_arrive();  // done reading the others' part; waited for at the end
  __syncthreads();

  float alpha[kFastSources], m = -INFINITY, z = 0.f;
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    alpha[i] = tot[2 * i] / sqrtf(tot[2 * i + 1] / float(D) + eps);
    m = fmaxf(m, alpha[i]);
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    alpha[i] = expf(alpha[i] - m);
    z += alpha[i];
  }
  float4 o = zero;
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    const float ai = alpha[i] / z;
    o.x += ai * v[i].x, o.y += ai * v[i].y, o.z += ai * v[i].z, o.w += ai * v[i].w;
  }
  if (bf16)
    o = make_float4(round_bf16_dev(o.x), round_bf16_dev(o.y), round_bf16_dev(o.z), round_bf16_dev(o.w));
  if (live) store4(a + t * D + d, o);
  if constexpr (!kNorm) {
    cluster.barrier_wait();  // no CTA exits while another may still read its part
    return;
  }

  const float ssa = cuda_ops::warp_sum(dot4(o, o));  // 0 from threads outside the slice
  if (lane == 0) red[warp][0] = ssa;                 // red's last readers passed the cluster barrier
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < n_warp; ++k) s += red[k][0];
    part_a = s;
  }
  cluster.sync();  // every part_a written; every CTA is done reading part
  float ss = 0.f;
  if (lane < kCluster) ss = *cluster.map_shared_rank(&part_a, lane);
  ss = cuda_ops::warp_sum(ss);  // butterfly: the same sum in every lane, warp and CTA
  cluster.barrier_arrive();     // done reading the others' part_a
  const float r = 1.0f / sqrtf(ss / float(D) + eps);
  if (live) {
    const auto norm = [&](float x, float wk) { return cuda_ops::rms_norm_out(x, r, wk, w, bf16); };
    store4(y + t * D + d, make_float4(norm(o.x, wd.x), norm(o.y, wd.y), norm(o.z, wd.z), norm(o.w, wd.w)));
  }
  cluster.barrier_wait();  // no CTA exits while another may still read its part_a
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The cluster path: at most kFastSources sources, d_model a multiple of 4 that kCluster CTAs of at most
// kClusterThreads threads cover one float4 each, 16-byte aligned rows, and few tokens.
bool cluster_fits(const std::vector<const float*>& sources, const float* q, int64_t n_tok, int64_t D,
                  std::initializer_list<const void*> outs) {
  static const bool on = env_switch("K3_NORM_CLUSTER", true);
  if (!on || int(sources.size()) > kFastSources || D % 4 != 0 ||
      D > 4 * int64_t(kCluster) * kClusterThreads ||
      n_tok > int64_t(kClusterTokPerSm) * cuda_ops::device_sm_count())
    return false;
  for (const float* p : sources)
    if (!aligned16(p)) return false;
  for (const void* p : outs)
    if (p && !aligned16(p)) return false;
  return aligned16(q);
}

// Sources by value, with the owed add checked: p must be the last source.
Status make_sources(const std::vector<const float*>& sources, ResidualAdd add, Sources* s) {
  *s = Sources{};
  s->n = int(sources.size());
  for (int i = 0; i < s->n; ++i) s->v[i] = sources[size_t(i)];
  if (add.p && (add.p != sources.back() || !add.o))
    return error(Code::invalid_argument, "AttnRes: the owed residual add is not on the partial sum");
  s->acc = add.p;
  s->add = add.p ? add.o : nullptr;
  return ok_status();
}

template <bool kNorm>
void launch_cluster(const GpuCtx& c, const Sources& s, const float* q, float eps, int64_t n_tok, int64_t D,
                    const float* w, float* a, float* y) {
  const int64_t per = (D / 4 + kCluster - 1) / kCluster;
  const int threads = int(std::max<int64_t>(32, (per + 31) / 32 * 32));
  attn_res_cluster_kernel<kNorm>
      <<<unsigned(n_tok * kCluster), unsigned(threads), 0, c.stream()>>>(s, q, eps, D, w, a, y, c.bf16());
}

}  // namespace

Status attn_res_norm_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                         int64_t n_tok, int64_t d_model, const float* w, float* a, float* y,
                         ResidualAdd add) {
  static const bool fused = env_switch("K3_ATTN_RES_NORM_FUSED", true);
  if (!fused || int(sources.size()) > kFastSources) {
    K3_RETURN_IF_ERROR(attn_res_mix_gpu(c, sources, q, eps, n_tok, d_model, a, add));
    rms_norm(c, a, w, eps, n_tok, d_model, y);
    return launch_status("attn_res + rms_norm");
  }
  if (sources.empty()) return error(Code::unsupported, "AttnRes over no sources");
  if (n_tok <= 0) return ok_status();
  Sources s;
  K3_RETURN_IF_ERROR(make_sources(sources, add, &s));
  if (cluster_fits(sources, q, n_tok, d_model, {w, a, y, add.o})) {
    launch_cluster<true>(c, s, q, eps, n_tok, d_model, w, a, y);
    return launch_status("attn_res_norm (cluster)");
  }
  attn_res_norm_kernel<<<unsigned(n_tok), kNormThreads, 0, c.stream()>>>(s, q, eps, d_model, w, a, y,
                                                                         c.bf16());
  return launch_status("attn_res_norm");
}

Status attn_res_mix_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                        int64_t n_tok, int64_t d_model, float* out, ResidualAdd add) {
  if (sources.empty() || int(sources.size()) > kMaxSources)
    return error(Code::unsupported, "AttnRes over " + std::to_string(sources.size()) + " sources (GPU max " +
                                        std::to_string(kMaxSources) + ")");
  if (n_tok <= 0) return ok_status();
  Sources s;
  K3_RETURN_IF_ERROR(make_sources(sources, add, &s));
  if (cluster_fits(sources, q, n_tok, d_model, {out, add.o})) {
    launch_cluster<false>(c, s, q, eps, n_tok, d_model, nullptr, out, nullptr);
    return launch_status("attn_res (cluster)");
  }
  attn_res_kernel<<<unsigned(n_tok), kMixThreads, 0, c.stream()>>>(s, q, eps, d_model, out, c.bf16());
  return launch_status("attn_res");
}

}  // namespace k3::gpu
