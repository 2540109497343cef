"""export.py: trained K3Model -> checkpoint directory in the K3 published layout (MODEL.md §9, §10).

  config.json                    k3_config.to_hf_config (nested text_config, quantization_config)
  model-0000i-of-0000n.safetensors + model.safetensors.index.json   shards of at most `shard_bytes`
  tiktoken.model, tokenizer_config.json                           copied from the tokenizer directory
Names: module path -> `language_model.model.<path>` (`language_model.lm_head.weight` for the head), with
  q_conv1d -> q_conv1d.weight, o_norm -> o_norm.weight, {self_attention,mlp,output_attn}_res.{proj,norm}.weight
  -> {..}_res_{proj,norm}.weight, gate.weight / gate.e_score_correction_bias as is.
Routed experts w1/w3 [E,F,Dl] and w2 [E,Dl,F] -> experts.{e}.{w}.weight_packed u8 [out,in/2] (low nibble =
even column) + weight_scale u8 E8M0 [out,in/32], with the QAT quantizer (moe.mxfp4_quantize).
dtypes: fp32 for A_log, dt_bias, the KDA conv weights, o_norm, e_score_correction_bias and the indexer
LayerNorm; bf16 for everything else. The safetensors writer is plain Python (no extra dependency).
"""
import json
import os
import shutil
import struct

import torch

from k3_config import to_hf_config
from moe import mxfp4_quantize

FP32_SUFFIXES = ("A_log", "dt_bias", "_conv1d.weight", "o_norm.weight", "e_score_correction_bias",
                 "indexer.k_norm.weight", "indexer.k_norm.bias")
ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8"}


def canonical_tensors(model) -> dict:
    """{canonical name (model.X / lm_head.weight): tensor on CPU in its checkpoint dtype}."""
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("qb_hist"):
            continue
        t = t.detach().cpu()
        if name.endswith((".w1", ".w2", ".w3")):
            prefix, w = name.rsplit(".", 1)
            nib, scale = mxfp4_quantize(t.float())
            packed = nib[..., 0::2] | (nib[..., 1::2] << 4)
            for e in range(t.shape[0]):
                out[f"model.{prefix}.experts.{e}.{w}.weight_packed"] = packed[e].contiguous()
                out[f"model.{prefix}.experts.{e}.{w}.weight_scale"] = scale[e].contiguous()
            continue
        for kind in ("self_attention_res", "mlp_res", "output_attn_res"):
            name = name.replace(f"{kind}.proj.", f"{kind}_proj.").replace(f"{kind}.norm.", f"{kind}_norm.")
        if name.endswith(("_conv1d", "o_norm")):
            name += ".weight"
        full = "lm_head.weight" if name == "lm_head.weight" else "model." + name
        out[full] = t.float() if full.endswith(FP32_SUFFIXES) else t.to(torch.bfloat16)
    return out


def published_name(canonical: str) -> str:
    return "language_model." + canonical


def _bytes(t: torch.Tensor) -> bytes:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().tobytes()
    return t.contiguous().numpy().tobytes()


def write_safetensors(path: str, tensors: dict, metadata: dict = None) -> int:
    """Data laid out largest element size first, then by name (as the safetensors package does); `metadata`
    (str -> str) joins {"format": "pt"} in the header's __metadata__."""
    header, blobs, off = {"__metadata__": {"format": "pt", **(metadata or {})}}, [], 0
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        b = _bytes(tensors[name])
        header[name] = {"dtype": ST_DTYPE[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(b)]}
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


def export(model, out_dir: str, tokenizer_dir: str = None, shard_bytes: int = 15 << 20) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    tensors = {published_name(n): t for n, t in canonical_tensors(model).items()}
    shards, cur, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = tensors[name]
        size += nbytes
    shards.append(cur)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = sum(write_safetensors(os.path.join(out_dir, f), s) for f, s in zip(files, shards))
    index = {"metadata": {"total_size": total},
             "weight_map": {n: files[i] for i, s in enumerate(shards) for n in sorted(s)}}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(to_hf_config(model.args), f, indent=2)
    if tokenizer_dir:
        for name in ("tiktoken.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    return {"tensors": len(tensors), "bytes": total, "shards": files}
