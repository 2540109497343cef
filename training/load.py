"""load.py: exported checkpoint directory -> K3Model (the inverse of export.py), for evaluation and checks.

Reads config.json (text_config) into ModelArgs, every *.safetensors shard with a plain-Python reader, maps
the published names back to module paths and dequantizes the MXFP4 experts (MODEL.md §9 decode):
  W[r,c] = +-E2M1[nib & 7] * 2^(scale[r, c/32] - 127),  nib = low nibble for even c, high for odd c.
Experts are loaded into the fp32 master weights; since the QAT quantizer is idempotent on its own grid up
to the sign of zero, a loaded model with qat on computes the same function as the exported one.
"""
import glob
import json
import os
import struct

import numpy as np
import torch

from k3_config import ModelArgs
from model import K3Model
from moe import mxfp4_dequantize

NP_DTYPE = {"F32": np.float32, "BF16": np.uint16, "U8": np.uint8}


def read_safetensors(path: str) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(data[lo:hi], dtype=NP_DTYPE[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            t = torch.from_numpy((arr.astype(np.uint32) << 16).view(np.float32).copy())
        else:
            t = torch.from_numpy(arr.copy())
        out[name] = t
    return out


def args_from_config(cfg: dict) -> ModelArgs:
    t = cfg["text_config"]
    la = t["linear_attn_config"]
    full = la["full_attn_layers"]
    every = full[0]
    assert full == [i for i in range(every, t["num_hidden_layers"] + 1, every)], "layer pattern"
    a = ModelArgs(vocab_size=t["vocab_size"], n_base=t["vocab_size"] - 256, d_model=t["hidden_size"],
                  n_layer=t["num_hidden_layers"], mla_every=every, rms_norm_eps=t["rms_norm_eps"],
                  kda_n_head=la["num_heads"], kda_d_head=la["head_dim"], conv_size=la["short_conv_kernel_size"],
                  gate_lower_bound=la["gate_lower_bound"], n_head=t["num_attention_heads"],
                  q_lora_rank=t["q_lora_rank"], kv_lora_rank=t["kv_lora_rank"],
                  qk_nope_head_dim=t["qk_nope_head_dim"], qk_rope_head_dim=t["qk_rope_head_dim"],
                  v_head_dim=t["v_head_dim"], intermediate_size=t["intermediate_size"], n_expert=t["num_experts"],
                  n_expert_used=t["num_experts_per_token"], n_shared_experts=t["num_shared_experts"],
                  moe_intermediate_size=t["moe_intermediate_size"],
                  routed_expert_hidden_size=t["routed_expert_hidden_size"],
                  routed_scaling_factor=t["routed_scaling_factor"], situ_beta=t["activation_situ_beta"],
                  situ_linear_beta=t["activation_situ_linear_beta"],
                  first_k_dense_replace=t["first_k_dense_replace"], attn_res_block_size=t["attn_res_block_size"])
    dsa = t.get("dsa_config")
    if dsa:
        a.dsa, a.index_n_head, a.index_head_dim, a.index_topk = (True, dsa["index_num_heads"],
                                                                  dsa["index_head_dim"], dsa["index_topk"])
    return a


def module_name(published: str) -> str:
    n = published[len("language_model."):]
    n = n[len("model."):] if n.startswith("model.") else n
    for kind in ("self_attention_res", "mlp_res", "output_attn_res"):
        n = n.replace(f"{kind}_proj.", f"{kind}.proj.").replace(f"{kind}_norm.", f"{kind}.norm.")
    for suffix in ("_conv1d.weight", "o_norm.weight"):
        if n.endswith(suffix):
            n = n[:-len(".weight")]
    return n


def load(model_dir: str) -> K3Model:
    with open(os.path.join(model_dir, "config.json")) as f:
        model = K3Model(args_from_config(json.load(f)))
    tensors = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        tensors.update(read_safetensors(path))
    state = model.state_dict()
    experts = {}
    for name, t in tensors.items():
        if ".experts." in name:
            head, rest = name.split(".experts.")
            e, w, kind = rest.split(".")
            experts.setdefault((module_name(head + ".x")[:-2] + "." + w, int(e)), {})[kind] = t
            continue
        key = module_name(name)
        if key not in state:
            raise KeyError(f"{model_dir}: unexpected tensor {name}")
        state[key].copy_(t.reshape(state[key].shape))
    for (key, e), parts in experts.items():
        packed = parts["weight_packed"]
        nib = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
        state[key][e].copy_(mxfp4_dequantize(nib, parts["weight_scale"]))
    model.set_qat(True)
    return model
