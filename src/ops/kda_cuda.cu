// kda_cuda.cu: the generic fp32 KDA kernels on the GPU (kda.h), any d_k <= 256 and any d_v: the
// token-by-token recurrence, written for correctness and odd shapes (the fast bf16 kernels are
// ops/kda_fast.h).
//
// Per head h, per token t (fp32, accurate expf), column b of S [d_k, d_v] only needs the shared vectors
// exp(g_t), k_t, q_t and its own v_t[b]:
//   S[:, b] *= exp(g_t);  u_b = beta_t (v_t[b] - k_t . S[:, b]);  S[:, b] += k_t u_b;  o_t[b] = q_t . S[:, b]
// so a block owns (head h, 32 columns b0 .. b0+31): lane = column, warp w = K slice {a : a % 8 == w}; each
// thread keeps its <= 32 entries of S in registers for the whole sequence, the two dot products are
// reduced across the 8 warps through shared memory. S is read once and written once (in place).
//
// kda_chunk_cuda runs this same recurrence (the chunk size is ignored): the chunkwise form equals it
// exactly in exact arithmetic, and the fast chunkwise kernels are kdagpu's (ops/kda_fast.h).
#include "ops/cuda_util.cuh"
#include "ops/kda.h"

namespace k3 {

namespace {

constexpr int kCols = 32, kSlices = 8, kMaxK = kCols * kSlices;  // 256 threads per block
constexpr int kRegs = kMaxK / kSlices;                           // S entries per thread

__global__ void __launch_bounds__(kCols* kSlices) kda_recurrent_kernel(KdaParams p) {
  __shared__ float q_s[kMaxK], k_s[kMaxK], eg_s[kMaxK], v_s[kCols];
  __shared__ float red_u[kSlices][kCols], red_o[kSlices][kCols];
  const int H = p.n_head, K = p.d_k, V = p.d_v;
  const int n_tiles = (V + kCols - 1) / kCols;
  const int h = blockIdx.x / n_tiles, b0 = (blockIdx.x % n_tiles) * kCols;
  const int lane = threadIdx.x & 31, sl = threadIdx.x >> 5;
  const int b = b0 + lane;
  const bool col_ok = b < V;
  float* Sh = p.S + int64_t(h) * K * V;

  float S[kRegs];
#pragma unroll
  for (int j = 0; j < kRegs; ++j) {
    const int a = sl + kSlices * j;
    S[j] = (col_ok && a < K) ? Sh[int64_t(a) * V + b] : 0.f;
  }
  // The next token's vectors are loaded into registers while this token is computed (one element of q, k,
  // g per thread: d_k <= blockDim), so the global-load latency is not paid once per token.
  const int tid = threadIdx.x;
  float nq = 0.f, nk = 0.f, ng = 0.f, nv = 0.f, nbeta = 0.f;
  auto prefetch = [&](int64_t t) {
    if (t >= p.n_tok) return;
    const int64_t row = t * H + h;
    if (tid < K) nq = p.q[row * K + tid], nk = p.k[row * K + tid], ng = p.g[row * K + tid];
    if (tid < kCols) nv = b0 + tid < V ? p.v[row * V + b0 + tid] : 0.f;
    nbeta = p.beta[row];
  };
  prefetch(0);
  for (int64_t t = 0; t < p.n_tok; ++t) {
    const int64_t row = t * H + h;
    __syncthreads();  // the previous token is done with the shared vectors
    if (tid < K) q_s[tid] = nq, k_s[tid] = nk, eg_s[tid] = expf(ng);
    if (tid < kCols) v_s[tid] = nv;
    const float beta = nbeta;
    prefetch(t + 1);
    __syncthreads();
    float part = 0.f;
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
      const int a = sl + kSlices * j;
      if (a < K) {
        S[j] *= eg_s[a];
        part += S[j] * k_s[a];
      }
    }
    red_u[sl][lane] = part;
    __syncthreads();
    float pred = 0.f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) pred += red_u[s][lane];
    const float u = beta * (v_s[lane] - pred);
    float part_o = 0.f;
#pragma unroll
    for (int j = 0; j < kRegs; ++j) {
      const int a = sl + kSlices * j;
      if (a < K) {
        S[j] += k_s[a] * u;
        part_o += S[j] * q_s[a];
      }
    }
    red_o[sl][lane] = part_o;
    __syncthreads();
    if (sl == 0 && col_ok) {
      float o = 0.f;
#pragma unroll
      for (int s = 0; s < kSlices; ++s) o += red_o[s][lane];
      p.o[row * V + b] = o;
    }
  }
#pragma unroll
  for (int j = 0; j < kRegs; ++j) {
    const int a = sl + kSlices * j;
    if (col_ok && a < K) Sh[int64_t(a) * V + b] = S[j];
  }
}

}  // namespace

void kda_recurrent_cuda(const KdaParams& p, GpuContext& g) {
  K3_ASSERT(p.n_head > 0 && p.d_k > 0 && p.d_v > 0);
  K3_ASSERT(p.d_k <= kMaxK);  // the generic kernel keeps a 256-row slice of S in registers
  if (p.n_tok <= 0) return;
  const int n_tiles = (p.d_v + kCols - 1) / kCols;
  kda_recurrent_kernel<<<unsigned(p.n_head * n_tiles), kCols * kSlices, 0, g.stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

void kda_chunk_cuda(const KdaParams& p, GpuContext& g) {
  kda_recurrent_cuda(p, g);
}

}  // namespace k3
