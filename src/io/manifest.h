// manifest.h: every tensor a ModelConfig implies, with its shape and allowed dtypes (MODEL.md §4-§10),
// under the canonical names of docs/tiny-models.md. Checkpoint::open checks a checkpoint against it.
//
//   D = d_model, V = n_vocab, HK = kda.n_head * kda.d_head, R = kda.gate_rank (from f_a_proj rows)
//   KDA   q/k/v_proj [HK, D], q/k/v_conv1d [HK, 1, W], f_a [R, D], f_b [HK, R], b_proj [H, D],
//         dt_bias [HK] f32, A_log [1,1,H,1] (KL) | [K] or [H] f32 (K3),
//         g_proj [HK, D] | g_a [R, D] + g_b [HK, R], o_norm [K], o_proj [D, HK]
//   MLA   q_proj [nh*dqk, D] | q_a [qr, D] + q_a_layernorm [qr] + q_b [nh*dqk, qr], kv_a_proj_with_mqa
//         [kvr+dr, D], kv_a_layernorm [kvr], kv_b [nh*(dn+dv), kvr], o_proj [D, nh*dv], g_proj [nh*dv, D]
//   DSA   indexer.wq_b [ih*id, qr], wk [id, D], weights_proj [ih, D], k_norm.{weight,bias} [id]
//   MoE   gate [E, D], e_score_correction_bias [E] f32, shared [ns*F, D]/[D, ns*F], latent down/norm/up,
//         experts.{e}.{w1,w3} [F, Din], w2 [Din, F]: bf16 `.weight`, or MXFP4 `.weight_packed` u8
//         [out, in/2] + `.weight_scale` u8 [out, in/32], chosen per expert by the suffix present.
// Value checks (check_manifest): K3 A_log[H:] == 0, MXFP4 scale bytes != 255.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "k3/config.h"

namespace k3 {

struct ExpectedTensor {
  std::string name;                          // canonical ("model.layers.3.self_attn.q_proj.weight")
  std::vector<std::vector<int64_t>> shapes;  // allowed shapes; the first is the usual one
  std::vector<DType> dtypes;                 // allowed dtypes
  int layer = -1;                            // -1: model-level tensor
  bool routed_expert = false;                // active for n_expert_used / n_expert of tokens
  int64_t n_param = 0;                       // logical weights (MXFP4 packed byte = 2, scales = 0)
};

// `has(name)` tells whether the checkpoint holds a tensor; it picks MXFP4 vs bf16 per expert.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c,
                                             const std::function<bool(const std::string&)>& has);

struct ParamCount {
  int64_t total = 0;
  int64_t active = 0;  // per token: everything but the routed experts, plus n_expert_used of them
};
ParamCount count_params(const ModelConfig& c, const std::vector<ExpectedTensor>& manifest);

// Presence, shape and dtype of every expected tensor, then the value checks; all problems in one
// Status (Code::bad_file, the first few named). `where` prefixes the message (the checkpoint dir).
Status check_manifest(const ModelConfig& c, const std::vector<ExpectedTensor>& manifest,
                      const std::function<const TensorView*(const std::string&)>& find,
                      const std::string& where);

}  // namespace k3
