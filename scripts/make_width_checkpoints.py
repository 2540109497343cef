#!/usr/bin/env python3
"""make_width_checkpoints.py: random-weight checkpoints at the published WIDTHS, few layers (benchmarks).

    python3 scripts/make_width_checkpoints.py --family kl --out /tmp/kl48-w4 [--layers 4] [--experts 16]
                                              [--experts-used 2] [--seed 1]
    python3 scripts/make_width_checkpoints.py --family k3 --out /tmp/k3-w4 ...

Widths are MODEL.md §1's (KL-48B: D 2304, 32 KDA heads x 128, 32 MLA heads, dense FFN 9216, experts 1024;
K3: D 7168, 96 heads, q_lora 1536, dense FFN 33792, shared 6144, latent 3584, experts 3072; both: vocab
163840, kv_lora 512, nope 128 / rope 64 / v 128). Only the depth and the number of experts are cut:
layer 1 is the dense FFN layer, the last layer is MLA, the others KDA (the 3:1 KDA:MLA pattern); every
layer after the first is MoE. Every weight is bf16 (K3's routed experts too: no quantization_config),
fp32 where MODEL.md says fp32. K3's attn_res_block_size is 2 (12 in K3) so that 4 layers cross a block.

Values: each bf16 matrix is a window of a shared pool of N(0, 1/fan_in) values (one pool per fan-in, a
random window start per tensor), so activations stay O(1) and writing 13 GB costs disk time only; the
pool period (2^24 + 7 values) is not a multiple of any row width, so no two rows are equal. Norm gains
are near 1, the router and the small fp32 tensors are drawn per tensor. Deterministic for a seed.

Sizes: --family kl (4 layers, 16 experts) 2.6 GB; --family k3 13.5 GB. The data is streamed to disk;
peak memory is about 0.5 GB. No tokenizer is written (k3 bench / k3 logits --tokens need none).
Needs numpy and ml_dtypes.
"""
import argparse
import json
import pathlib
import struct

import ml_dtypes
import numpy as np

BF16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
ST = {BF16: "BF16", F32: "F32"}
POOL = (1 << 24) + 7
V, BOS, STOP, PAD = 163840, 163584, 163586, 163839


def text_config(family, n_layer, n_expert, n_used):
    k3 = family == "k3"
    full = [n_layer]
    c = {
        "vocab_size": V, "hidden_size": 7168 if k3 else 2304, "num_hidden_layers": n_layer,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "linear_attn_config": {"full_attn_layers": full,
                               "kda_layers": [i for i in range(1, n_layer + 1) if i not in full],
                               "num_heads": 96 if k3 else 32, "head_dim": 128, "short_conv_kernel_size": 4},
        "num_attention_heads": 96 if k3 else 32, "num_key_value_heads": 96 if k3 else 32,
        "head_dim": 128 if k3 else 72, "q_lora_rank": 1536 if k3 else None, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
        "hidden_act": "situ" if k3 else "silu", "intermediate_size": 33792 if k3 else 9216,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_experts": n_expert,
        "num_experts_per_token": n_used, "num_shared_experts": 2 if k3 else 1,
        "moe_intermediate_size": 3072 if k3 else 1024, "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True, "routed_scaling_factor": 1.0 if k3 else 2.446, "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
        "bos_token_id": BOS, "eos_token_id": STOP, "pad_token_id": PAD, "model_max_length": 1048576,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
    }
    if k3:
        c["linear_attn_config"].update({"use_full_rank_gate": True, "gate_lower_bound": -5.0})
        c.update({"mla_use_output_gate": True, "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
                  "routed_expert_hidden_size": 3584, "latent_moe_use_norm": True, "topk_method": "noaux_tc",
                  "attn_res_block_size": 2, "model_type": "kimi_linear"})
    else:
        c.update({"rope_theta": 10000.0, "rope_scaling": None})
    return c


def make_config(family, t):
    if family == "kl":
        return {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", **t}
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
            "bos_token_id": BOS, "eos_token_id": STOP, "pad_token_id": PAD, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "text_config": t}


def tensor_specs(family, t):
    """[(name, shape, dtype, init)] with init = ("lin", fan_in, gain) | ("normal", std) | ("norm",) | array."""
    k3 = family == "k3"
    D, L, E = t["hidden_size"], t["num_hidden_layers"], t["num_experts"]
    la = t["linear_attn_config"]
    H, K = la["num_heads"], la["head_dim"]
    nh, qr, kvr = t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"]
    dn, dr, dv = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    dff, dffe = t["intermediate_size"], t["moe_intermediate_size"]
    dsh = t["num_shared_experts"] * dffe
    f32_or = F32 if k3 else BF16
    s = []

    def lin(name, out, inp, gain=1.0):
        s.append((name, (out, inp), BF16, ("lin", inp, gain)))

    def norm(name, n, dt=BF16):
        s.append((name, (n,), dt, ("norm",)))

    s.append(("model.embed_tokens.weight", (V, D), BF16, ("normal", 1.0)))
    norm("model.norm.weight", D)
    lin("lm_head.weight", V, D)
    if k3:
        s.append(("model.output_attn_res_proj.weight", (1, D), BF16, ("normal", 0.1)))
        norm("model.output_attn_res_norm.weight", D)
    for i in range(L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", D)
        norm(p + "post_attention_layernorm.weight", D)
        if k3:
            for r in ("self_attention_res", "mlp_res"):
                s.append((p + r + "_proj.weight", (1, D), BF16, ("normal", 0.1)))
                norm(p + r + "_norm.weight", D)
        a = p + "self_attn."
        if (i + 1) in la["kda_layers"]:
            for x in "qkv":
                lin(a + f"{x}_proj.weight", H * K, D)
                s.append((a + f"{x}_conv1d.weight", (H * K, 1, 4), f32_or, ("normal", 0.5)))
            lin(a + "f_a_proj.weight", 128, D)
            lin(a + "f_b_proj.weight", H * K, 128, 0.5)
            lin(a + "b_proj.weight", H, D)
            if k3:
                s.append((a + "dt_bias", (H * K,), F32, ("uniform", -3.0, 0.0)))
                s.append((a + "A_log", (K,), F32, ("a_log_k3", H)))
                lin(a + "g_proj.weight", H * K, D)
            else:
                s.append((a + "dt_bias", (H * K,), F32, ("dt_bias_kl",)))
                s.append((a + "A_log", (1, 1, H, 1), F32, ("a_log_kl",)))
                lin(a + "g_a_proj.weight", 128, D)
                lin(a + "g_b_proj.weight", H * K, 128)
            norm(a + "o_norm.weight", K, f32_or)
            lin(a + "o_proj.weight", D, H * K)
        else:
            if qr:
                lin(a + "q_a_proj.weight", qr, D)
                norm(a + "q_a_layernorm.weight", qr)
                lin(a + "q_b_proj.weight", nh * (dn + dr), qr)
            else:
                lin(a + "q_proj.weight", nh * (dn + dr), D)
            lin(a + "kv_a_proj_with_mqa.weight", kvr + dr, D)
            norm(a + "kv_a_layernorm.weight", kvr)
            lin(a + "kv_b_proj.weight", nh * (dn + dv), kvr)
            lin(a + "o_proj.weight", D, nh * dv)
            if k3:
                lin(a + "g_proj.weight", nh * dv, D)
        if i < t["first_k_dense_replace"]:
            lin(p + "mlp.gate_proj.weight", dff, D)
            lin(p + "mlp.up_proj.weight", dff, D)
            lin(p + "mlp.down_proj.weight", D, dff)
            continue
        m = p + "block_sparse_moe."
        s.append((m + "gate.weight", (E, D), BF16, ("normal", 1.0 / np.sqrt(D))))
        s.append((m + "gate.e_score_correction_bias", (E,), F32, ("normal", 0.01)))
        lin(m + "shared_experts.gate_proj.weight", dsh, D)
        lin(m + "shared_experts.up_proj.weight", dsh, D)
        lin(m + "shared_experts.down_proj.weight", D, dsh)
        dz = t["routed_expert_hidden_size"] if k3 else D
        if k3:
            lin(m + "routed_expert_down_proj.weight", dz, D)
            norm(m + "routed_expert_norm.weight", dz)
            lin(m + "routed_expert_up_proj.weight", D, dz)
        for e in range(E):
            lin(m + f"experts.{e}.w1.weight", dffe, dz)
            lin(m + f"experts.{e}.w3.weight", dffe, dz)
            lin(m + f"experts.{e}.w2.weight", dz, dffe)
    if k3:
        s = [("language_model.lm_head.weight" if n == "lm_head.weight" else "language_model." + n, sh, dt, it)
             for n, sh, dt, it in s]
    return s


class Source:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.pools = {}

    def pool(self, fan_in, gain):
        key = (fan_in, gain)
        if key not in self.pools:
            r = np.random.default_rng(hash(key) & 0xFFFFFFFF)
            self.pools[key] = (r.standard_normal(POOL, dtype=np.float32) * (gain / np.sqrt(fan_in))).astype(BF16)
        return self.pools[key]

    def small(self, shape, dt, init):
        n = int(np.prod(shape))
        kind = init[0]
        if kind == "normal":
            a = self.rng.standard_normal(n) * init[1]
        elif kind == "norm":
            a = 1.0 + 0.1 * self.rng.standard_normal(n)
        elif kind == "uniform":
            a = self.rng.uniform(init[1], init[2], n)
        elif kind == "dt_bias_kl":  # softplus(dt_bias) = dt in (1e-3, 1e-1)
            dt_ = np.exp(self.rng.uniform(np.log(1e-3), np.log(1e-1), n))
            a = dt_ + np.log(-np.expm1(-dt_))
        elif kind == "a_log_kl":
            a = np.log(self.rng.uniform(1.0, 16.0, n))
        elif kind == "a_log_k3":
            a = np.zeros(n)
            a[: init[1]] = np.log(self.rng.uniform(0.5, 2.0, init[1]))
        else:
            raise ValueError(kind)
        return a.astype(np.float32).astype(dt).reshape(shape)

    def write(self, f, shape, dt, init):
        n = int(np.prod(shape))
        if init[0] != "lin" and not (init[0] == "normal" and n > (1 << 22)):
            f.write(self.small(shape, dt, init).tobytes())
            return
        pool = self.pool(init[1], init[2]) if init[0] == "lin" else self.pool(1, init[1])
        off = int(self.rng.integers(POOL))
        while n > 0:
            k = min(n, POOL - off)
            f.write(pool[off: off + k].tobytes())
            n -= k
            off = 0


def write_checkpoint(family, out, n_layer, n_expert, n_used, seed):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t = text_config(family, n_layer, n_expert, n_used)
    (out / "config.json").write_text(json.dumps(make_config(family, t), indent=2) + "\n")
    specs = sorted(tensor_specs(family, t), key=lambda s: (-s[2].itemsize, s[0]))  # aligned: f32 first
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, dt, _ in specs:
        nb = int(np.prod(shape)) * dt.itemsize
        header[name] = {"dtype": ST[dt], "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    src = Source(seed)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape, dt, init in specs:
            src.write(f, shape, dt, init)
    print(f"{out}: {family}, {n_layer} layers, {n_expert} experts (top {n_used}), {len(specs)} tensors, "
          f"{off / 1e9:.2f} GB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=["kl", "k3"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--experts-used", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.layers < 2 or not 1 <= a.experts_used <= a.experts:
        ap.error("need --layers >= 2 and 1 <= --experts-used <= --experts")
    write_checkpoint(a.family, a.out, a.layers, a.experts, a.experts_used, a.seed)


if __name__ == "__main__":
    main()
