"""config.py: the model description the reference needs, parsed from config.json (MODEL.md §1-2).

Layouts:
  KL   (model_type "kimi_linear"): every key at the top level.
  K3   (model_type "kimi_k3"):     text keys under `text_config`.
  K3.1 (kimi_k3 + text_config.dsa_config): DSA on the full-attention layers; every dsa key required.
Layer lists in the config are 1-based; everything here is 0-based:
  kda(i) := i+1 in kda_layers,  mla(i) := i+1 in full_attn_layers (each layer in exactly one list)
  moe(i) := i >= first_k_dense_replace and i % moe_layer_freq == 0
Unknown or inconsistent configs raise ValueError naming the key.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field


def _req(d: dict, key: str, where: str):
    if key not in d or d[key] is None:
        raise ValueError(f"config.json: missing key {where}{key}")
    return d[key]


@dataclass
class Config:
    family: str                      # "kl" | "k3" | "k31"
    d_model: int                     # hidden_size
    n_layer: int                     # num_hidden_layers
    n_vocab: int                     # vocab_size
    rms_norm_eps: float
    act: str                         # "silu" | "situ"
    situ_beta: float                 # activation_situ_beta (beta1)
    situ_linear_beta: float | None   # activation_situ_linear_beta (beta2); None -> b = u
    d_ff: int                        # intermediate_size (dense MLP)
    first_k_dense_replace: int
    moe_layer_freq: int
    attn_res_block_size: int         # 0 = plain pre-norm residual (KL)
    # KDA (linear_attn_config)
    kda_n_head: int
    kda_d_head: int
    kda_conv: int                    # short_conv_kernel_size
    kda_full_rank_gate: bool         # output gate g_proj instead of g_a_proj/g_b_proj
    kda_gate_lower_bound: float | None   # None -> KL gate -exp(A_log) softplus(z)
    # MLA
    mla_n_head: int
    q_lora_rank: int                 # 0 = plain q_proj
    kv_lora_rank: int
    d_nope: int
    d_rope: int
    d_v: int
    mla_output_gate: bool
    # MoE
    n_expert: int
    n_expert_used: int
    n_shared_expert: int
    d_ff_expert: int
    d_latent: int                    # routed_expert_hidden_size; 0 = experts at full width (KL)
    latent_norm: bool
    renormalize: bool
    routed_scaling_factor: float
    # DSA (K3.1)
    dsa: bool = False
    dsa_n_head: int = 0
    dsa_d_head: int = 0
    dsa_topk: int = 0
    layer_attn: list = field(default_factory=list)   # per layer: "kda" | "mla" | "dsa"
    layer_moe: list = field(default_factory=list)    # per layer: bool


def load_config(model_dir) -> Config:
    raw = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    if raw.get("model_type") == "kimi_k3":
        t, where = _req(raw, "text_config", ""), "text_config."
        family = "k31" if t.get("dsa_config") is not None else "k3"
    elif raw.get("model_type") == "kimi_linear":
        t, where, family = raw, "", "kl"
    else:
        raise ValueError(f"config.json: unknown model_type {raw.get('model_type')!r}")

    lac = _req(t, "linear_attn_config", where)
    lw = where + "linear_attn_config."
    n_layer = _req(t, "num_hidden_layers", where)
    kda_layers = set(_req(lac, "kda_layers", lw))
    full_layers = set(_req(lac, "full_attn_layers", lw))
    layer_attn = []
    for i in range(n_layer):
        in_kda, in_full = (i + 1) in kda_layers, (i + 1) in full_layers
        if in_kda == in_full:
            raise ValueError(f"config.json: layer {i + 1} must be in exactly one of kda_layers/full_attn_layers")
        layer_attn.append("kda" if in_kda else "mla")

    act = _req(t, "hidden_act", where)
    if act not in ("silu", "situ"):
        raise ValueError(f"config.json: unsupported {where}hidden_act {act!r}")
    n_group, topk_group = t.get("num_expert_group") or 1, t.get("topk_group") or 1
    if n_group != 1 or topk_group != 1:
        raise ValueError("config.json: grouped top-k with more than one group is not supported")

    cfg = Config(
        family=family,
        d_model=_req(t, "hidden_size", where),
        n_layer=n_layer,
        n_vocab=_req(t, "vocab_size", where),
        rms_norm_eps=float(_req(t, "rms_norm_eps", where)),
        act=act,
        situ_beta=float(t.get("activation_situ_beta", 4.0)),
        situ_linear_beta=(float(t["activation_situ_linear_beta"])
                          if t.get("activation_situ_linear_beta") is not None else None),
        d_ff=_req(t, "intermediate_size", where),
        first_k_dense_replace=t.get("first_k_dense_replace", 0),
        moe_layer_freq=t.get("moe_layer_freq", 1),
        attn_res_block_size=t.get("attn_res_block_size") or 0,
        kda_n_head=_req(lac, "num_heads", lw),
        kda_d_head=_req(lac, "head_dim", lw),
        kda_conv=_req(lac, "short_conv_kernel_size", lw),
        kda_full_rank_gate=bool(lac.get("use_full_rank_gate", False)),
        kda_gate_lower_bound=(float(lac["gate_lower_bound"]) if lac.get("gate_lower_bound") is not None
                              else None),
        mla_n_head=_req(t, "num_attention_heads", where),
        q_lora_rank=t.get("q_lora_rank") or 0,
        kv_lora_rank=_req(t, "kv_lora_rank", where),
        d_nope=_req(t, "qk_nope_head_dim", where),
        d_rope=_req(t, "qk_rope_head_dim", where),
        d_v=_req(t, "v_head_dim", where),
        mla_output_gate=bool(t.get("mla_use_output_gate", False)),
        n_expert=t.get("num_experts") or 0,
        n_expert_used=t.get("num_experts_per_token") or 0,
        n_shared_expert=t.get("num_shared_experts") or 0,
        d_ff_expert=t.get("moe_intermediate_size") or 0,
        d_latent=t.get("routed_expert_hidden_size") or 0,
        latent_norm=bool(t.get("latent_moe_use_norm", False)),
        renormalize=bool(t.get("moe_renormalize", True)),
        routed_scaling_factor=float(t.get("routed_scaling_factor", 1.0)),
        layer_attn=layer_attn,
    )
    cfg.layer_moe = [cfg.n_expert > 0 and i >= cfg.first_k_dense_replace and i % cfg.moe_layer_freq == 0
                     for i in range(n_layer)]

    dsa = t.get("dsa_config")
    if dsa is not None:
        dw = where + "dsa_config."
        for key in ("dsa_layers", "index_num_heads", "index_head_dim", "index_topk", "index_topk_freq",
                    "index_k_norm_type"):
            _req(dsa, key, dw)  # MODEL.md §13 #19: no defaults
        if set(dsa["dsa_layers"]) != full_layers:
            raise ValueError("config.json: dsa_config.dsa_layers must equal full_attn_layers")
        if dsa["index_topk_freq"] != 1:
            raise ValueError("config.json: dsa_config.index_topk_freq must be 1")
        if dsa["index_k_norm_type"] != "layernorm":
            raise ValueError("config.json: dsa_config.index_k_norm_type must be 'layernorm'")
        cfg.dsa, cfg.dsa_n_head, cfg.dsa_d_head = True, dsa["index_num_heads"], dsa["index_head_dim"]
        cfg.dsa_topk = dsa["index_topk"]
        cfg.layer_attn = ["dsa" if a == "mla" else a for a in cfg.layer_attn]
    return cfg
