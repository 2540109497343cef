// kda_fast.h: the fast bf16 KDA kernels for the real shapes (K = V = 128) on the GPU: chunkwise prefill
// over a variable-length batch, and one fused decode step per layer over a batch of cache slots.
// Math: MODEL.md §4 (kda.h holds the recurrence and the chunkwise WY/UT form). The generic fp32 kernels of
// kda.h stay the fallback for other shapes and for unbounded (KL) gates.
//
// Prefill (kda_prefill_fast_cuda), per sequence s (tokens cu_seqlens[s] .. cu_seqlens[s+1]) and head h:
//   S <- diag(exp(g_t)) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t      (fp32 state)
// q, k are l2-normalized (q also scaled by K^-1/2), g the per-channel log-decay in [-5, 0] (K3's
// lower-bounded gate: the kernel forms exp(G_i - G_r) split through a 16-row reference, which stays inside
// fp32 only when 15 steps of decay are >= e^-80; an unbounded gate gives NaN there, never a silent value).
// Chunk C = 64 walked in order by one CTA per (sequence, head, half of V); inside a chunk the products are
// tensor-core MMAs (tf32 m16n8k8, fp32 accumulate) and (I + L)^-1 is a blocked 16x16 inversion:
//   V' = T (beta V - (beta exp(G) K) S);  O = (exp(G) Q) S + A V';  S <- diag(exp(G_C)) S + Kd^T V'
// with T = (I + L)^-1 and Kd = exp(G_C - G) K (kda.h's W S folded as T ((beta exp(G) K) S)).
//
// Decode (kda_decode_fast_cuda), one token per sequence, per (sequence b, head h), in place in slot[b]:
//   x~ = [q~, k~, v~]_t (pre-conv projections); y = SiLU(sum_j w[c,j] window_j) (bf16), window rolls by one
//   q = l2norm(y_q) * K^-1/2, k = l2norm(y_k), v = y_v;  beta = sigmoid(b);  g = -5 sigmoid(exp(A_log_h) (f +
//   dt_bias)) the recurrence step above on S[slot[b], h];  o = bf16(S^T q) out = o * rsqrt(mean(o^2) + eps) *
//   w_onorm * sigmoid(gate)        (FusedRMSNormGated, sigmoid)
//
// Both return a Status naming the op and the shape when the shape is not supported (d_k, d_v != 128,
// null pointers, bad cu_seqlens sizes); the caller then uses kda.h's generic kernels. All pointers are
// DEVICE pointers, work is enqueued on g.stream (asynchronous).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

struct KdaPrefillParams {
  int n_seq = 0;      // sequences in the batch
  int64_t n_tok = 0;  // total tokens (= cu_seqlens[n_seq])
  int n_head = 0, d_k = 128, d_v = 128;
  const int* cu_seqlens = nullptr;  // [n_seq + 1] token offsets (device), cu_seqlens[0] = 0
  const uint16_t* q = nullptr;      // [n_tok, n_head, d_k] bf16, l2-normalized, scaled by d_k^-1/2
  const uint16_t* k = nullptr;      // [n_tok, n_head, d_k] bf16, l2-normalized
  const uint16_t* v = nullptr;      // [n_tok, n_head, d_v] bf16
  const uint16_t* g = nullptr;      // [n_tok, n_head, d_k] bf16 log-decay in [-5, 0]
  const float* beta = nullptr;      // [n_tok, n_head] fp32 in (0, 1) (MODEL.md §4 step 4 keeps it fp32)
  float* S = nullptr;               // [n_slot, n_head, d_k, d_v] fp32 in/out (read at start, written at end)
  const int* slot = nullptr;        // [n_seq] state slot of each sequence; nullptr: slot = sequence index
  bool zero_initial_state = false;  // true: start from S = 0 (S is still written at the end)
  uint16_t* o = nullptr;            // [n_tok, n_head, d_v] bf16
};

struct KdaDecodeParams {
  int n_seq = 0;  // sequences, one token each
  int n_head = 0, d_k = 128, d_v = 128;
  const uint16_t* qkv = nullptr;  // [n_seq, 3, n_head * d_k] bf16 pre-conv projections q~, k~, v~
  const float* conv_w = nullptr;  // [3, n_head * d_k, 4] fp32 (q_conv1d, k_conv1d, v_conv1d; tap 3 = current)
  const uint16_t* f = nullptr;    // [n_seq, n_head * d_k] bf16 f_b_proj output (decay pre-activation)
  const float* dt_bias = nullptr;  // [n_head * d_k] fp32
  const float* A_log = nullptr;    // [n_head] fp32
  const uint16_t* b = nullptr;     // [n_seq, n_head] bf16 b_proj output (beta logit)
  const uint16_t* gate = nullptr;  // [n_seq, n_head * d_v] bf16 output-gate projection
  const float* o_norm = nullptr;   // [d_v] fp32 o_norm weight
  float eps = 1e-5f;               // rms_norm_eps of o_norm
  float g_lower = -5.f;            // gate_lower_bound
  const int* slot = nullptr;       // [n_seq] cache slot of each sequence (device)
  float* S = nullptr;              // [n_slot, n_head, d_k, d_v] fp32, updated in place
  uint16_t* conv = nullptr;        // [n_slot, 3, 3, n_head * d_k] bf16 last 3 pre-conv inputs, oldest first
  uint16_t* out = nullptr;         // [n_seq, n_head * d_v] bf16 gated-norm output (the o_proj input)
  // Optional: the k and v conv taps [n_head * d_k, 4] in arrays of their own (conv_w then holds q's only).
  const float* conv_w_k = nullptr;
  const float* conv_w_v = nullptr;
  // KL's gate form g = -exp(A_log_h) softplus(f + dt_bias) instead of g_lower sigmoid(exp(A_log_h) (f + dt_bias)).
  bool softplus_gate = false;
  // Per-sequence state pointers instead of S / conv + slot (device arrays [n_seq] of device pointers): sequence
  // b's state is S_seq[b] [n_head, d_k, d_v] and its window conv_seq[b] [3, 3, n_head * d_k] (the GPU model,
  // whose sequences own separate allocations). Both or neither; then slot, S and conv may be null.
  float* const* S_seq = nullptr;
  uint16_t* const* conv_seq = nullptr;
  // Optional: up to kKdaInlineSeq sequences' state pointers carried in the parameters themselves (no device
  // table to fill first; S_inline[0] != nullptr selects them, n_seq <= kKdaInlineSeq, S_seq / S / conv
  // unused).
  static constexpr int kKdaInlineSeq = 8;
  float* S_inline[kKdaInlineSeq] = {};
  uint16_t* conv_inline[kKdaInlineSeq] = {};
  // Optional: the inputs and the output as fp32 rows (bf16 values, the GPU model's projection outputs) in
  // place of qkv, f, gate, b and out; row b is sequence b. x32[0] != nullptr selects the inputs: x32 = {q~,
  // k~, v~, f, gate} [n_seq, n_head * d_k], x32[5] = b [n_seq, n_head]; out32 [n_seq, n_head * d_v] gets
  // bf16(y) as fp32 (out32 != nullptr; out unused).
  const float* x32[6] = {};
  float* out32 = nullptr;
  // Optional intermediates (nullptr: not written), fp32 [n_seq, ...] rows: the traced names of model/kda.cpp.
  float* q_out = nullptr;     // [n_seq, n_head * d_k] q^ = l2norm(q) d_k^-1/2
  float* k_out = nullptr;     // [n_seq, n_head * d_k] k^
  float* v_out = nullptr;     // [n_seq, n_head * d_v] v (bf16 values)
  float* g_out = nullptr;     // [n_seq, n_head * d_k] log-decay g
  float* beta_out = nullptr;  // [n_seq, n_head] beta
  float* o_out = nullptr;     // [n_seq, n_head * d_v] bf16(S^T q), before the gated norm
};

// Checks the shape (the only one served: d_k = d_v = 128) and enqueues the kernel.
Status kda_prefill_fast_cuda(const KdaPrefillParams& p, GpuContext& g);
// The prefill runs the two-kernel version (a parallel pre-pass into g.workspace, then the state walk), which
// needs g.workspace of at least this many bytes (n_head x 64.5 KiB, one chunk of 64 tokens of every head;
// more takes more chunks per pass) and fails with a Status otherwise. K3_KDA_PREFILL_SPLIT=0 in the
// environment runs the one-kernel version instead (no workspace). Both checked on the H200 (session 4).
size_t kda_prefill_fast_workspace_bytes(int n_head);
bool kda_prefill_split_enabled();  // false only with K3_KDA_PREFILL_SPLIT=0 (read once)
Status kda_decode_fast_cuda(const KdaDecodeParams& p, GpuContext& g);

// Host references in fp64 on the same inputs (pointers are HOST pointers here, same layouts): the
// token-by-token recurrence over each sequence, and the decode step composed op by op.
void kda_prefill_fast_ref(const KdaPrefillParams& p);
void kda_decode_fast_ref(const KdaDecodeParams& p);
// The two-kernel GPU prefill emulated on the host (kda_fast_prefill_emu.cpp): the
// same chunk numbering, windows of `window` chunks, decomposition and rounding points (fp16 scratch, tf32 MMA
// operands, fp32 accumulation and state, bf16 o); HOST pointers. Checks the algorithm without a GPU.
void kda_prefill_split_emulate(const KdaPrefillParams& p, int64_t window);

// Shape check shared by both backends: ok, or a message naming the op and the shape.
Status kda_prefill_fast_check(const KdaPrefillParams& p);
Status kda_decode_fast_check(const KdaDecodeParams& p);

}  // namespace k3
