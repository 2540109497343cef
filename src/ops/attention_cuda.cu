// attention_cuda.cu: causal / sparse softmax attention on the GPU (attention.h), the plain first version:
// one block per (query i, head h), an online softmax over the source set in tiles of kTile kv rows.
//
//   per tile: s_j = scale * q . k_j (one warp per row j, fp32, warp-reduced)
//             m' = max(m, max_j s_j);  p_j = exp(s_j - m');  c = exp(m - m')
//             z = z c + sum_j p_j;     acc[:] = acc[:] c + sum_j p_j v_j[:]
//   out = acc / z  (an empty source set gives 0, as attention_cpu does)
// Sources: dense causal s = 0 .. min(q_pos0 + i, n_kv - 1); sparse sel[i, :] without the -1 slots (and
// without any index outside [0, n_kv), which the contract excludes). fp32 throughout, accurate expf.
// Shared memory: q [d_qk], acc [d_v], s/p [kTile], source rows [kTile].
#include "ops/attention.h"
#include "ops/cuda_util.cuh"

namespace k3 {

namespace {

using namespace cuda_ops;

constexpr int kTile = 32, kThreads = 128;

// Offset (in floats) of the int64 source rows: after q, acc and the scores, rounded up to 8 bytes.
__host__ __device__ inline int64_t src_offset(const AttentionParams& p) {
  const int64_t off = int64_t(p.d_qk) + p.d_v + kTile;
  return off + (off & 1);
}

__global__ void attention_kernel(AttentionParams p) {
  extern __shared__ float smem[];
  float* q_s = smem;                                                // [d_qk]
  float* acc = q_s + p.d_qk;                                        // [d_v]
  float* pr = acc + p.d_v;                                          // [kTile] scores, then probabilities
  int64_t* src = reinterpret_cast<int64_t*>(smem + src_offset(p));  // [kTile]
  const int64_t i = blockIdx.x / p.n_head;
  const int h = int(blockIdx.x % p.n_head);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warp = blockDim.x >> 5;

  const float* q = p.q + i * p.q_tok_stride + int64_t(h) * p.q_head_stride;
  for (int c = tid; c < p.d_qk; c += blockDim.x) q_s[c] = q[c];
  for (int c = tid; c < p.d_v; c += blockDim.x) acc[c] = 0.f;
  // candidate slots: dense = positions 0 .. last; sparse = the n_sel slots of row i
  const int64_t n_cand = p.sel ? p.n_sel : (p.q_pos0 + i < p.n_kv ? p.q_pos0 + i : p.n_kv - 1) + 1;
  float m = -INFINITY, z = 0.f;
  __syncthreads();
  for (int64_t j0 = 0; j0 < n_cand; j0 += kTile) {
    if (tid < kTile) {
      const int64_t j = j0 + tid;
      int64_t s = -1;
      if (j < n_cand) s = p.sel ? int64_t(p.sel[i * p.n_sel + j]) : j;
      src[tid] = (s >= 0 && s < p.n_kv) ? s : -1;
    }
    __syncthreads();
    for (int r = warp; r < kTile; r += n_warp) {  // scores, one warp per kv row
      const int64_t s = src[r];
      float d = 0.f;
      if (s >= 0) {
        const float* k = p.k + s * p.k_tok_stride + int64_t(h) * p.k_head_stride;
        for (int c = lane; c < p.d_qk; c += 32) d += q_s[c] * k[c];
        d = warp_sum(d);
      }
      if (lane == 0) pr[r] = s >= 0 ? d * p.scale : -INFINITY;
    }
    __syncthreads();
    float m_tile = -INFINITY;
    for (int r = 0; r < kTile; ++r) m_tile = fmaxf(m_tile, pr[r]);
    const float m_new = fmaxf(m, m_tile);
    __syncthreads();                   // everyone has read the scores before they become probabilities
    if (m_new == -INFINITY) continue;  // nothing valid yet (uniform across the block)
    if (tid < kTile) pr[tid] = src[tid] >= 0 ? expf(pr[tid] - m_new) : 0.f;
    __syncthreads();
    const float corr = expf(m - m_new);  // m = -inf: 0 (acc and z are 0 then)
    float z_tile = 0.f;
    for (int r = 0; r < kTile; ++r) z_tile += pr[r];
    z = z * corr + z_tile;
    m = m_new;
    for (int c = tid; c < p.d_v; c += blockDim.x) {
      float a = acc[c] * corr;
      for (int r = 0; r < kTile; ++r) {
        const int64_t s = src[r];
        if (s >= 0) a += pr[r] * p.v[s * p.v_tok_stride + int64_t(h) * p.v_head_stride + c];
      }
      acc[c] = a;
    }
    __syncthreads();  // src / pr are rewritten by the next tile
  }
  float* out = p.out + (i * p.n_head + h) * int64_t(p.d_v);
  const float inv = z > 0.f ? 1.f / z : 0.f;
  for (int c = tid; c < p.d_v; c += blockDim.x) out[c] = acc[c] * inv;
}

}  // namespace

void attention_cuda(const AttentionParams& p, GpuContext& g) {
  K3_ASSERT(p.n_head > 0 && p.d_qk > 0 && p.d_v > 0);
  if (p.n_q <= 0) return;
  const size_t smem = size_t(src_offset(p)) * sizeof(float) + kTile * sizeof(int64_t);
  K3_ASSERT(smem <= 48 * 1024);  // d_qk + d_v up to ~12k floats
  attention_kernel<<<unsigned(p.n_q * p.n_head), kThreads, smem, g.stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
