// kda.h: the Kimi Delta Attention recurrence over one sequence (MODEL.md §4, step 6 and the chunkwise form).
//
// Per head h, with fp32 state S [K, V] carried in and out:
//   S <- diag(exp(g_t)) S;  u = v_t - S^T k_t;  S <- S + k_t (beta_t u)^T;  o_t = S^T q_t   (read after
//   write)
// q, k are already l2-normalized (q also scaled by K^-1/2); g <= 0 is the per-channel log-decay.
//
// Chunkwise (WY/UT) form, chunk C, G = in-chunk cumsum of g (a K-vector per row):
//   L[i,j] = beta_i sum_d k_id k_jd exp(G_id - G_jd) (j < i);  T = (I + L)^-1 diag(beta)
//   W = T (exp(G) . K);  U = T V;  V' = U - W S;  A[i,j] = sum_d q_id k_jd exp(G_id - G_jd) (j <= i)
//   O = (exp(G) . Q) S + A V';  S <- diag(exp(G_C)) S + (exp(G_C - G) . K)^T V'
// Only differences of G are exponentiated, so no factor can overflow (KL's gate is unbounded).
// A short tail chunk is processed as is; nothing pads the state.
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct KdaParams {
  int64_t n_tok = 0;
  int n_head = 0, d_k = 0, d_v = 0;
  const float* q = nullptr;     // [n_tok, n_head, d_k]
  const float* k = nullptr;     // [n_tok, n_head, d_k]
  const float* v = nullptr;     // [n_tok, n_head, d_v]
  const float* g = nullptr;     // [n_tok, n_head, d_k] log-decay, <= 0
  const float* beta = nullptr;  // [n_tok, n_head] in (0, 1)
  float* S = nullptr;           // [n_head, d_k, d_v] fp32, in/out
  float* o = nullptr;           // [n_tok, n_head, d_v]
  int chunk = 64;               // chunkwise form only
};

// Plain reference: the token-by-token recurrence in fp64 (S widened on entry, narrowed on exit).
void kda_ref(const KdaParams& p);
// Fast CPU, token by token (decode): fp32, threads over heads.
void kda_recurrent_cpu(const KdaParams& p, ThreadPool* pool);
// Fast CPU, chunkwise WY/UT form (prefill): fp32, threads over heads.
void kda_chunk_cpu(const KdaParams& p, ThreadPool* pool);
// Generic CUDA versions (core/gpu.h): device pointers, fp32, any d_k/d_v; the fast bf16 kernels for real
// shapes are declared in ops/kda_fast.h.
void kda_recurrent_cuda(const KdaParams& p, GpuContext& g);
void kda_chunk_cuda(const KdaParams& p, GpuContext& g);

}  // namespace k3
