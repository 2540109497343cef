// weights_gpu.h: the model's weights on the device, uploaded from the CPU binding (model/weights.h), so the
// GPU reads exactly the tensors the CPU model binds, by the same canonical names (docs/tiny-models.md).
//
// Every LinearWeight keeps its checkpoint dtype (bf16 / f16 / f32 / fp8, or MXFP4 packed + E8M0 scales) with
// `w` / `scale` now DEVICE pointers (ops/linear.h linear_cuda reads them). Small vectors (norm gains, conv
// taps, dt_bias, A_log, AttnRes queries, router bias) are fp32 device arrays of the same length as the host
// copies. One DeviceArena holds everything: its size is counted in a first pass over the weights, then
// filled.
#pragma once

#include <memory>
#include <vector>

#include "core/gpu.h"
#include "core/status.h"
#include "gpu/arena.h"
#include "k3/config.h"
#include "model/ffn.h"
#include "model/weights.h"
#include "ops/linear.h"
#include "ops/moe_experts.h"

namespace k3::gpu {

struct KdaWeightsGpu {
  LinearWeight q_proj, k_proj, v_proj;                                  // [H*K, D]
  const float *q_conv = nullptr, *k_conv = nullptr, *v_conv = nullptr;  // [H*K, W]
  LinearWeight f_a_proj, f_b_proj;                                      // [r, D], [H*K, r]
  const float* dt_bias = nullptr;                                       // [H*K]
  const float* A_log = nullptr;                                         // [H]
  LinearWeight b_proj;                                                  // [H, D]
  LinearWeight g_proj;                                                  // [H*K, D] (K3)
  LinearWeight g_a_proj, g_b_proj;                                      // [r, D], [H*K, r] (KL)
  const float* o_norm = nullptr;                                        // [K]
  LinearWeight o_proj;                                                  // [D, H*K]
};

struct DsaWeightsGpu {
  LinearWeight wq_b, wk, weights_proj;                   // [Hi*Di, q_lora], [Di, D], [Hi, D]
  const float *k_norm_w = nullptr, *k_norm_b = nullptr;  // [Di]
};

struct MlaWeightsGpu {
  LinearWeight q_proj, q_a_proj, q_b_proj;  // KL: q_proj; K3: q_a_proj, q_b_proj
  const float* q_a_layernorm = nullptr;     // [q_lora_rank]
  LinearWeight kv_a_proj_with_mqa;          // [d_latent, D]
  const float* kv_a_layernorm = nullptr;    // [kv_lora_rank]
  LinearWeight kv_b_proj;                   // [n_head*(d_nope + d_v), kv_lora_rank]
  const float* kv_b_f32 = nullptr;          // unless kv_b_proj is bf16: the same, fp32 (absorbed path)
  LinearWeight o_proj, g_proj;              // [D, n_head*d_v], [n_head*d_v, D]
  bool has_dsa = false;
  DsaWeightsGpu dsa;
};

struct MoeWeightsGpu {
  LinearWeight gate;                // [n_expert, D]
  // Unless K3_MOE_FAST=0 at load (the fused kernels; weights_gpu.cu walk_moe):
  // the K3 bf16 router and latent down-projection stored as one matrix (gate / latent_down are views of it),
  // one GEMM reads x once for both; absent (w null) when the dtypes differ or the switch is off.
  LinearWeight gate_down;           // [n_expert + d_latent, D]
  const MoeExpertPtrs* expert_table = nullptr;  // [n_expert] device pointers: every expert MXFP4 and the switch on
  const float* bias = nullptr;      // [n_expert]
  std::vector<FfnWeights> experts;  // device views, [n_expert]
  FfnWeights shared;
  LinearWeight latent_down, latent_up;  // K3 LatentMoE
  const float* latent_norm = nullptr;   // [d_latent] or null
};

struct LayerWeightsGpu {
  AttnKind kind = AttnKind::kda;
  bool moe = false;
  const float *input_layernorm = nullptr, *post_attention_layernorm = nullptr;  // [D]
  KdaWeightsGpu kda;
  MlaWeightsGpu mla;
  FfnWeights mlp;
  MoeWeightsGpu moe_w;
  const float *q_attn_res = nullptr, *q_mlp_res = nullptr;  // [D] (K3)
};

struct ModelWeightsGpu {
  DType embed_dtype = DType::bf16;
  const void* embed = nullptr;  // [n_vocab, D] in its checkpoint dtype (bf16 / f16 / f32)
  const float* norm = nullptr;  // [D]
  LinearWeight lm_head;         // [n_vocab, D]
  const float* q_out_res = nullptr;
  std::vector<LayerWeightsGpu> layers;
  DeviceArena arena;  // owns every byte above
  size_t bytes = 0;
};

// Uploads every tensor of `host` (bound from a Checkpoint by bind_model) to the current device.
Result<std::unique_ptr<ModelWeightsGpu>> upload_model(const ModelWeights& host, const ModelConfig& cfg,
                                                      GpuContext& g);

}  // namespace k3::gpu
