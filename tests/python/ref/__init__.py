"""ref: an independent NumPy reference of Kimi Linear / K3 / K3.1, written from MODEL.md §1-§10 and §13.

Entry points:
    Reference(model_dir, precision="fp32"|"bf16")   -> .forward(tokens, state=None, trace=None) -> logits [T, V]
    Checkpoint(model_dir)                           -> canonical tensors decoded to float64 (.get(name))
    load_config(model_dir)                          -> Config
Files: checkpoint.py (safetensors, BF16/F16/F32/U8/F8_E4M3, MXFP4), config.py, numerics.py (rounding points),
kda.py (§4), mla.py (§5-6), attn_res.py (§7), ffn.py (§8), model.py (layer loop, §2/§7/§10).
"""
from .checkpoint import Checkpoint, mxfp4_decode
from .config import Config, load_config
from .model import Reference, State
from .numerics import Numerics, round_bf16

__all__ = ["Checkpoint", "Config", "Numerics", "Reference", "State", "load_config", "mxfp4_decode",
           "round_bf16"]
