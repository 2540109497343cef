// kda_transition.h: the affine state map of one KDA segment (KDA context parallelism, docs/parallel.md).
//
// The KDA recurrence (ops/kda.h) is affine in the state. Per head, token t:
//   S_t = A_t S_{t-1} + beta_t k_t v_t^T,   A_t = (I - beta_t k_t k_t^T) diag(exp(g_t))      [K, K]
// so over a segment of T tokens, from any carried-in state S_0:
//   S_T = M S_0 + S~,   M = A_T ... A_1  [K, K],   S~ = the state reached from S_0 = 0  [K, V]
// Ranks holding consecutive segments of one sequence compute (M_j, S~_j) from their own tokens only, exchange
// them (2 K^2 + ... numbers per head, independent of T), and compose S <- M_j S + S~_j in segment order.
// M is the state reached from S_0 = I with v = 0, so the fast form runs the chunkwise KDA once on the
// widened values [v | 0] from the state [0 | I].
#pragma once

#include <cstdint>

namespace k3 {

class ThreadPool;

struct KdaTransitionParams {
  int64_t n_tok = 0;
  int n_head = 0, d_k = 0, d_v = 0;
  const float* k = nullptr;     // [n_tok, n_head, d_k] l2-normalized
  const float* v = nullptr;     // [n_tok, n_head, d_v]
  const float* g = nullptr;     // [n_tok, n_head, d_k] log-decay, <= 0
  const float* beta = nullptr;  // [n_tok, n_head]
  float* M = nullptr;           // [n_head, d_k, d_k] out
  float* S = nullptr;           // [n_head, d_k, d_v] out: S~ (zero start)
  int chunk = 64;               // chunkwise form only
};

// Plain reference: token by token in fp64.
void kda_transition_ref(const KdaTransitionParams& p);
// Fast CPU: the chunkwise KDA (kda_chunk_cpu) on [v | 0] from [0 | I]; fp32, threads over heads.
void kda_transition_cpu(const KdaTransitionParams& p, ThreadPool* pool);
// S [n_head, d_k, d_v] <- M S + S~ per head (the composition step), fp32.
void kda_transition_apply(const float* M, const float* S_tilde, int n_head, int d_k, int d_v, float* S);

}  // namespace k3
