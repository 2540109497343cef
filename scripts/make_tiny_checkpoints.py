#!/usr/bin/env python3
"""make_tiny_checkpoints.py: writes models/tiny-kl, models/tiny-k3, models/tiny-k31, models/tiny-k3-mla
(docs/tiny-models.md).

Small random-weight checkpoints in the PUBLISHED layouts (MODEL.md §1, §4-§10):
  tiny-kl   flat config.json (model_type kimi_linear), names model.*, bf16 experts, one model.safetensors
  tiny-k3   config.json with text_config + quantization_config (compressed-tensors mxfp4-pack-quantized),
            names language_model.model.* / language_model.lm_head.weight, MXFP4 routed experts
            (weight_packed u8 [out, in/2], weight_scale u8 E8M0 [out, in/32]), fake vision_tower.* /
            mm_projector.* tensors, 2 shards + model.safetensors.index.json
  tiny-k31  as tiny-k3 + text_config.dsa_config and self_attn.indexer.* in the DSA layers, one file
  tiny-k3-mla  as tiny-k3 with the production MLA head widths (kv_lora 512, nope 128, rope 64, v 128: the
            shapes of the GPU's tensor-core MLA kernels), 4 heads, 4 layers, one file
Weights: normal * 1/sqrt(fan_in) so activations stay O(1); norms near 1; fp32 where MODEL.md says fp32.
Tokenizer files come from tests/data/tokenizer-tiny-{k2,k3}/ when present, else a placeholder
(256 single bytes + 768 two-byte merges = 1024 ranks, 256 specials at 1024..1279).
Deterministic (fixed seeds). Needs numpy and ml_dtypes only.  Usage: python3 scripts/make_tiny_checkpoints.py
"""
import base64
import json
import pathlib
import shutil
import struct

import ml_dtypes
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
N_BASE, N_VOCAB = 1024, 1280
BOS, EOS_META, STOP, PAD = N_BASE + 0, N_BASE + 1, N_BASE + 2, N_BASE + 255
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
ST_DTYPE = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.uint8): "U8"}


# ---------------------------------------------------------------- safetensors writer
def write_safetensors(path, tensors):
    """tensors: dict name -> np.ndarray (f32, bf16 or u8). Like the safetensors package, data is laid out
    by element size (largest first), then name, so every tensor is aligned to its element size."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n)):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": ST_DTYPE[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return off


# ---------------------------------------------------------------- weight initializers
class Init:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def linear(self, out, inp, gain=1.0, dtype=ml_dtypes.bfloat16):  # [out, in]
        return (self.rng.standard_normal((out, inp)) * gain / np.sqrt(inp)).astype(np.float32).astype(dtype)

    def norm(self, n, dtype=ml_dtypes.bfloat16):  # near 1
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32).astype(dtype)

    def normal(self, shape, std, dtype=ml_dtypes.bfloat16):
        return (self.rng.standard_normal(shape) * std).astype(np.float32).astype(dtype)

    def mxfp4(self, out, inp):
        """A normal [out, in] weight (std 1/sqrt(in)) quantized OCP-MX style: per 32 inputs, scale =
        2^(floor(log2(amax)) - 2), elements rounded to the nearest E2M1 value (clamped at 6).
        Returns (weight_packed u8 [out, in/2] low nibble = even column, weight_scale u8 [out, in/32])."""
        assert inp % 32 == 0
        w = self.rng.standard_normal((out, inp)).astype(np.float32) * 1.5 / np.sqrt(inp)
        blocks = w.reshape(out, inp // 32, 32)
        amax = np.maximum(np.abs(blocks).max(axis=2), 2.0**-20)
        e = np.floor(np.log2(amax)).astype(np.int32) - 2  # 2^e: block scale
        scaled = np.abs(blocks) / np.exp2(e)[..., None]
        mag_idx = np.abs(scaled[..., None] - E2M1).argmin(axis=-1)  # nearest magnitude
        nib = (mag_idx | np.where(blocks < 0, 8, 0)).astype(np.uint8).reshape(out, inp)
        packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
        scale = (e + 127).astype(np.uint8)
        return packed, scale


BF16, F32 = ml_dtypes.bfloat16, np.float32


# ---------------------------------------------------------------- per-family configs
def linear_attn_config(n_layer, full_attn, k3):
    c = {"full_attn_layers": full_attn, "kda_layers": [i for i in range(1, n_layer + 1) if i not in full_attn],
         "num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4}
    if k3:
        c.update({"use_full_rank_gate": True, "gate_lower_bound": -5.0})
    return c


def text_keys(k3, n_layer, full_attn):
    c = {
        "vocab_size": N_VOCAB, "hidden_size": 64, "num_hidden_layers": n_layer, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "linear_attn_config": linear_attn_config(n_layer, full_attn, k3),
        "num_attention_heads": 4 if k3 else 2, "num_key_value_heads": 4 if k3 else 2,
        "head_dim": 16 if k3 else 32, "q_lora_rank": 32 if k3 else None, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "mla_use_nope": True,
        "hidden_act": "situ" if k3 else "silu", "intermediate_size": 128,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_experts": 8, "num_experts_per_token": 2,
        "num_shared_experts": 1, "moe_intermediate_size": 32, "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True, "routed_scaling_factor": 1.0 if k3 else 2.446, "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
        "bos_token_id": BOS, "eos_token_id": STOP, "pad_token_id": PAD, "model_max_length": 1048576,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16",
    }
    if k3:
        c.update({"mla_use_output_gate": True, "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
                  "routed_expert_hidden_size": 32, "latent_moe_use_norm": True, "topk_method": "noaux_tc",
                  "attn_res_block_size": 3, "model_type": "kimi_linear"})
    else:
        c.update({"rope_theta": 10000.0, "rope_scaling": None})
    return c


def quantization_config():
    return {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
                                      "input_activations": None, "output_activations": None,
                                      "weights": {"num_bits": 4, "type": "float", "symmetric": True,
                                                  "strategy": "group", "group_size": 32, "dynamic": False,
                                                  "actorder": None, "observer": "minmax", "scale_dtype": "uint8"}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                   "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj.*",
                   "re:vision_tower.*", "re:mm_projector.*"],
    }


def make_config(family):
    if family == "kl":
        c = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}
        c.update(text_keys(False, 6, [4, 6]))
        return c
    tc = text_keys(True, 4, [2, 4]) if family == "k3mla" else text_keys(True, 8, [4, 8])
    if family == "k3mla":
        tc.update({"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                   "head_dim": 128})
    if family == "k31":
        tc["dsa_config"] = {"dsa_layers": [4, 8], "index_num_heads": 2, "index_head_dim": 16, "index_topk": 8,
                            "index_topk_freq": 1, "index_k_norm_type": "layernorm", "index_skip_topk_offset": 0}
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "bos_token_id": BOS, "eos_token_id": STOP, "pad_token_id": PAD, "media_placeholder_token_id": N_BASE + 21,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "text_config": tc,
        "vision_config": {"patch_size": 2, "vt_hidden_size": 8, "vt_num_hidden_layers": 1, "text_hidden_size": 64},
        "quantization_config": quantization_config(),
    }


# ---------------------------------------------------------------- tensors (canonical names, then prefixed)
def make_tensors(cfg, family, seed):
    ini = Init(seed)
    k3 = family != "kl"
    t = cfg["text_config"] if k3 else cfg
    D, L, V = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    la = t["linear_attn_config"]
    H, K, W, R = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"], 16  # R: KDA gate rank
    nh, qr, kvr = t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"]
    dn, dr, dv = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    E, dffe, dff = t["num_experts"], t["moe_intermediate_size"], t["intermediate_size"]
    dsh = t["num_shared_experts"] * dffe
    dsa = t.get("dsa_config")
    out = {}
    f32_or = F32 if k3 else BF16

    out["model.embed_tokens.weight"] = ini.normal((V, D), 1.0)
    out["model.norm.weight"] = ini.norm(D)
    out["lm_head.weight"] = ini.linear(V, D)
    if k3:
        out["model.output_attn_res_proj.weight"] = ini.normal((1, D), 0.1)
        out["model.output_attn_res_norm.weight"] = ini.norm(D)
    for i in range(L):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ini.norm(D)
        out[p + "post_attention_layernorm.weight"] = ini.norm(D)
        if k3:
            for s in ("self_attention_res", "mlp_res"):
                out[p + s + "_proj.weight"] = ini.normal((1, D), 0.1)
                out[p + s + "_norm.weight"] = ini.norm(D)
        a = p + "self_attn."
        if (i + 1) in la["kda_layers"]:
            for x in "qkv":
                out[a + f"{x}_proj.weight"] = ini.linear(H * K, D)
                out[a + f"{x}_conv1d.weight"] = ini.normal((H * K, 1, W), 0.5, f32_or)
            out[a + "f_a_proj.weight"] = ini.linear(R, D)
            out[a + "f_b_proj.weight"] = ini.linear(H * K, R, 0.5)
            out[a + "b_proj.weight"] = ini.linear(H, D)
            if k3:  # g = -5 sigmoid(exp(A_log) z): dt_bias in (-3, 0) gives g in about (-2.5, -0.2)
                out[a + "dt_bias"] = ini.rng.uniform(-3.0, 0.0, H * K).astype(F32)
                a_log = np.zeros(K, F32)
                a_log[:H] = np.log(ini.rng.uniform(0.5, 2.0, H))
                out[a + "A_log"] = a_log
                out[a + "g_proj.weight"] = ini.linear(H * K, D)
            else:  # g = -exp(A_log) softplus(z): dt = softplus(dt_bias) in (1e-3, 1e-1), A in (1, 16)
                dt = np.exp(ini.rng.uniform(np.log(1e-3), np.log(1e-1), H * K))
                out[a + "dt_bias"] = (dt + np.log(-np.expm1(-dt))).astype(F32)
                out[a + "A_log"] = np.log(ini.rng.uniform(1.0, 16.0, (1, 1, H, 1))).astype(F32)
                out[a + "g_a_proj.weight"] = ini.linear(R, D)
                out[a + "g_b_proj.weight"] = ini.linear(H * K, R)
            out[a + "o_norm.weight"] = ini.norm(K, f32_or)
            out[a + "o_proj.weight"] = ini.linear(D, H * K)
        else:  # MLA (K3.1: + DSA indexer)
            if qr:
                out[a + "q_a_proj.weight"] = ini.linear(qr, D)
                out[a + "q_a_layernorm.weight"] = ini.norm(qr)
                out[a + "q_b_proj.weight"] = ini.linear(nh * (dn + dr), qr)
            else:
                out[a + "q_proj.weight"] = ini.linear(nh * (dn + dr), D)
            out[a + "kv_a_proj_with_mqa.weight"] = ini.linear(kvr + dr, D)
            out[a + "kv_a_layernorm.weight"] = ini.norm(kvr)
            out[a + "kv_b_proj.weight"] = ini.linear(nh * (dn + dv), kvr)
            out[a + "o_proj.weight"] = ini.linear(D, nh * dv)
            if k3:
                out[a + "g_proj.weight"] = ini.linear(nh * dv, D)
            if dsa:
                ih, idh = dsa["index_num_heads"], dsa["index_head_dim"]
                out[a + "indexer.wq_b.weight"] = ini.linear(ih * idh, qr)
                out[a + "indexer.wk.weight"] = ini.linear(idh, D)
                out[a + "indexer.weights_proj.weight"] = ini.linear(ih, D)
                out[a + "indexer.k_norm.weight"] = ini.norm(idh, F32)
                out[a + "indexer.k_norm.bias"] = ini.normal(idh, 0.1, F32)
        if i < t["first_k_dense_replace"] or i % t["moe_layer_freq"] != 0:
            out[p + "mlp.gate_proj.weight"] = ini.linear(dff, D)
            out[p + "mlp.up_proj.weight"] = ini.linear(dff, D)
            out[p + "mlp.down_proj.weight"] = ini.linear(D, dff)
            continue
        m = p + "block_sparse_moe."
        out[m + "gate.weight"] = ini.linear(E, D)
        out[m + "gate.e_score_correction_bias"] = ini.normal(E, 0.01, F32)
        out[m + "shared_experts.gate_proj.weight"] = ini.linear(dsh, D)
        out[m + "shared_experts.up_proj.weight"] = ini.linear(dsh, D)
        out[m + "shared_experts.down_proj.weight"] = ini.linear(D, dsh)
        if k3:
            lat = t["routed_expert_hidden_size"]
            out[m + "routed_expert_down_proj.weight"] = ini.linear(lat, D)
            out[m + "routed_expert_norm.weight"] = ini.norm(lat)
            out[m + "routed_expert_up_proj.weight"] = ini.linear(D, lat)
            for e in range(E):
                for w, (o, n) in (("w1", (dffe, lat)), ("w3", (dffe, lat)), ("w2", (lat, dffe))):
                    pk, sc = ini.mxfp4(o, n)
                    out[m + f"experts.{e}.{w}.weight_packed"] = pk
                    out[m + f"experts.{e}.{w}.weight_scale"] = sc
        else:
            for e in range(E):
                out[m + f"experts.{e}.w1.weight"] = ini.linear(dffe, D)
                out[m + f"experts.{e}.w3.weight"] = ini.linear(dffe, D)
                out[m + f"experts.{e}.w2.weight"] = ini.linear(D, dffe)
    if not k3:
        return out
    pub = {}  # published K3 names
    for n, v in out.items():
        pub["language_model.lm_head.weight" if n == "lm_head.weight" else "language_model." + n] = v
    pub["vision_tower.patch_embed.proj.weight"] = ini.normal((8, 3, 2, 2), 0.1)
    pub["vision_tower.encoder.final_layernorm.weight"] = ini.norm(8)
    pub["mm_projector.proj.0.weight"] = ini.linear(32, 32)
    return pub


# ---------------------------------------------------------------- tokenizer files
K2_NAMES = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
            6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
            11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
            14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
            18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
            254: "[UNK]", 255: "[PAD]"}
K3_NAMES = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
            9: "[EOT]", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
            254: "[UNK]", 255: "[PAD]"}


def placeholder_tokenizer(dst, names):
    ranks = [bytes([b]) for b in range(256)]
    firsts, seconds = " etaoinshrdlucmfwypvbgkjqxz", "etaoinshrdlucmfwypvbgkjqxz ,.'"
    for a in firsts:
        for b in seconds:
            if len(ranks) < N_BASE and a + b != "  ":
                ranks.append((a + b).encode())
    assert len(ranks) == N_BASE, len(ranks)
    with open(dst / "tiktoken.model", "w") as f:
        for r, tok in enumerate(ranks):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")
    dec = {}
    for off in range(256):
        tid = N_BASE + off
        dec[str(tid)] = {"content": names.get(off, f"<|reserved_token_{tid}|>"), "lstrip": False,
                         "normalized": False, "rstrip": False, "single_word": False, "special": True}
    tc = {"added_tokens_decoder": dec, "bos_token": "[BOS]", "eos_token": names[2], "pad_token": "[PAD]",
          "unk_token": "[UNK]", "model_max_length": 1048576, "tokenizer_class": "TikTokenTokenizer",
          "clean_up_tokenization_spaces": False, "placeholder": True}
    (dst / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")


def write_tokenizer(dst, k3):
    src = ROOT / "tests" / "data" / ("tokenizer-tiny-k3" if k3 else "tokenizer-tiny-k2")
    if src.is_dir() and (src / "tiktoken.model").exists():
        for f in src.iterdir():
            if f.is_file():
                shutil.copy(f, dst / f.name)
        return "copied " + str(src.relative_to(ROOT))
    placeholder_tokenizer(dst, K3_NAMES if k3 else K2_NAMES)
    return "placeholder"


# ---------------------------------------------------------------- main
def write_model(family, seed, shards):
    dst = ROOT / "models" / {"kl": "tiny-kl", "k3": "tiny-k3", "k31": "tiny-k31", "k3mla": "tiny-k3-mla"}[family]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    cfg = make_config(family)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = make_tensors(cfg, family, seed)
    if shards == 1:
        write_safetensors(dst / "model.safetensors", tensors)
    else:  # embeddings + first half of the layers in shard 1, the rest (head, vision) in shard 2
        L = (cfg.get("text_config") or cfg)["num_hidden_layers"]

        def shard_of(n):
            if "embed_tokens" in n:
                return 0
            if ".layers." in n:
                return 0 if int(n.split(".layers.")[1].split(".")[0]) < L // 2 else 1
            return 1

        files = [f"model-{s + 1:05d}-of-{shards:05d}.safetensors" for s in range(shards)]
        parts = [{n: v for n, v in tensors.items() if shard_of(n) == s} for s in range(shards)]
        total = sum(write_safetensors(dst / files[s], parts[s]) for s in range(shards))
        index = {"metadata": {"total_size": total},
                 "weight_map": {n: files[shard_of(n)] for n in sorted(tensors)}}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    tok = write_tokenizer(dst, family != "kl")
    print(f"{dst.relative_to(ROOT)}: {len(tensors)} tensors, {shards} shard(s), tokenizer {tok}")


if __name__ == "__main__":
    write_model("kl", 1001, 1)
    write_model("k3", 1003, 2)
    write_model("k31", 1031, 1)
    write_model("k3mla", 1033, 1)
