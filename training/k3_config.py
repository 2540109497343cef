"""k3_config.py: the shape of the small K3 / K3.1 model and its published config.json (MODEL.md §1, §2).

ModelArgs holds the dimensions under the glossary names; to_hf_config() writes the K3 published layout:
top-level model_type "kimi_k3" with a nested text_config (model_type "kimi_linear"), the
compressed-tensors MXFP4 quantization_config (routed experts only) and, for K3.1, text_config.dsa_config
with every key explicit. Layer lists in the config are 1-based (MODEL.md §2).
Layer pattern: mla(i) := (i+1) % mla_every == 0, so 12 layers give 3 x [KDA, KDA, KDA, MLA] (the last layer
is MLA, as in K3); layer 0 is dense, layers 1.. are Stable LatentMoE. The default size keeps each exported
checkpoint (bf16 + MXFP4 experts) under 38 MB (issue 4: <= 40 MB in git); training/size.py computes it.
"""
import dataclasses


@dataclasses.dataclass
class ModelArgs:
    vocab_size: int = 16384          # n_base BPE ranks + 256 specials
    n_base: int = 16128
    d_model: int = 256
    n_layer: int = 12
    mla_every: int = 4               # 1-based layers 4, 8, 12 are MLA
    rms_norm_eps: float = 1e-5
    # KDA (linear_attn_config)
    kda_n_head: int = 4
    kda_d_head: int = 64             # K = V; the gate rank (f_a_proj rows) is also kda_d_head
    conv_size: int = 4
    gate_lower_bound: float = -5.0
    kda_chunk: int = 16              # chunk length of the training kernel (MODEL.md §4 chunkwise form)
    # Gated MLA (NoPE)
    n_head: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32       # the shared, unrotated "r" part
    v_head_dim: int = 64
    # FFN
    intermediate_size: int = 512    # dense layer 0
    n_expert: int = 56
    n_expert_used: int = 8
    n_shared_experts: int = 1
    moe_intermediate_size: int = 64
    routed_expert_hidden_size: int = 128   # latent width = d_model / 2
    routed_scaling_factor: float = 1.0
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    first_k_dense_replace: int = 1
    attn_res_block_size: int = 4
    # K3.1 Gated DSA
    dsa: bool = False
    index_n_head: int = 4
    index_head_dim: int = 32
    index_topk: int = 128
    # special ids (offsets from n_base, FORMATS.md §1.3)
    max_len: int = 1048576

    @property
    def bos_id(self):
        return self.n_base + 0

    @property
    def stop_id(self):
        return self.n_base + 2

    @property
    def pad_id(self):
        return self.n_base + 255

    def is_mla(self, i: int) -> bool:
        return (i + 1) % self.mla_every == 0

    def is_moe(self, i: int) -> bool:
        return i >= self.first_k_dense_replace

    def full_attn_layers(self):
        return [i + 1 for i in range(self.n_layer) if self.is_mla(i)]


def tiny_args(**kw) -> ModelArgs:
    """Toy size for CPU smoke tests: every structural feature, tiny widths."""
    base = dict(vocab_size=16384, d_model=64, n_layer=4, mla_every=2, kda_n_head=2, kda_d_head=32, n_head=2,
                q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                intermediate_size=128, n_expert=8, n_expert_used=2, n_shared_experts=1, moe_intermediate_size=32,
                routed_expert_hidden_size=32, attn_res_block_size=2, index_n_head=2, index_head_dim=16,
                index_topk=8, kda_chunk=16)
    base.update(kw)
    return ModelArgs(**base)


def quantization_config():
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
               "dynamic": False, "actorder": None, "observer": "minmax", "scale_dtype": "uint8"}
    return {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
                                      "input_activations": None, "output_activations": None, "weights": weights}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                   "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj.*",
                   "re:vision_tower.*", "re:mm_projector.*"],
    }


def to_hf_config(a: ModelArgs) -> dict:
    full = a.full_attn_layers()
    text = {
        "model_type": "kimi_linear", "vocab_size": a.vocab_size, "hidden_size": a.d_model,
        "num_hidden_layers": a.n_layer, "rms_norm_eps": a.rms_norm_eps, "tie_word_embeddings": False,
        "linear_attn_config": {"full_attn_layers": full,
                               "kda_layers": [i for i in range(1, a.n_layer + 1) if i not in full],
                               "num_heads": a.kda_n_head, "head_dim": a.kda_d_head,
                               "short_conv_kernel_size": a.conv_size, "use_full_rank_gate": True,
                               "gate_lower_bound": a.gate_lower_bound},
        "num_attention_heads": a.n_head, "num_key_value_heads": a.n_head,
        "head_dim": a.qk_nope_head_dim + a.qk_rope_head_dim,
        "q_lora_rank": a.q_lora_rank, "kv_lora_rank": a.kv_lora_rank, "qk_nope_head_dim": a.qk_nope_head_dim,
        "qk_rope_head_dim": a.qk_rope_head_dim, "v_head_dim": a.v_head_dim, "mla_use_nope": True,
        "mla_use_output_gate": True, "hidden_act": "situ", "activation_situ_beta": a.situ_beta,
        "activation_situ_linear_beta": a.situ_linear_beta, "intermediate_size": a.intermediate_size,
        "first_k_dense_replace": a.first_k_dense_replace, "moe_layer_freq": 1, "num_experts": a.n_expert,
        "num_experts_per_token": a.n_expert_used, "num_shared_experts": a.n_shared_experts,
        "moe_intermediate_size": a.moe_intermediate_size, "routed_expert_hidden_size": a.routed_expert_hidden_size,
        "latent_moe_use_norm": True, "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
        "routed_scaling_factor": a.routed_scaling_factor, "use_grouped_topk": True, "num_expert_group": 1,
        "topk_group": 1, "topk_method": "noaux_tc", "attn_res_block_size": a.attn_res_block_size,
        "num_nextn_predict_layers": 0, "bos_token_id": a.bos_id, "eos_token_id": a.stop_id,
        "pad_token_id": a.pad_id, "model_max_length": a.max_len, "initializer_range": 0.02,
        "use_cache": True, "torch_dtype": "bfloat16",
    }
    if a.dsa:
        text["dsa_config"] = {"dsa_layers": full, "index_num_heads": a.index_n_head,
                              "index_head_dim": a.index_head_dim, "index_topk": a.index_topk,
                              "index_topk_freq": 1, "index_k_norm_type": "layernorm", "index_skip_topk_offset": 0}
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "bos_token_id": a.bos_id, "eos_token_id": a.stop_id, "pad_token_id": a.pad_id,
        "media_placeholder_token_id": a.n_base + 21, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "text_config": text,
        "quantization_config": quantization_config(),
    }
