"""checkpoint.py: a self-contained safetensors reader for the reference (no safetensors package).

File layout: u64 little-endian N, then N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]}, ...},
then the data; offsets are relative to the first byte after the header. Shards are listed in
model.safetensors.index.json ("weight_map": name -> file).

Decoding (every value exact in float64):
  BF16 : uint16 << 16 reinterpreted as float32        F16/F32/F64: native
  F8_E4M3 (fn): s eeee mmm, bias 7, subnormal m/8 * 2^-6, s1111111 = NaN, no inf
  U8/I*: returned as integers
MXFP4 (MODEL.md §9, compressed-tensors): W[r,c] = fp4(nibble) * 2^(weight_scale[r, c/32] - 127),
  nibble = low 4 bits of weight_packed[r, c/2] for even c, high 4 bits for odd c;
  fp4 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}[nib & 7], sign bit nib & 8; scale byte 255 is rejected.
Names are canonical (docs/tiny-models.md): language_model.lm_head.X -> lm_head.X,
  language_model.model.X -> model.X, language_model.X -> model.X; vision/projector tensors are dropped.
"""
from __future__ import annotations

import json
import pathlib
import struct

import numpy as np

from .config import load_config

FP4_MAGNITUDE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float64 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f8_e4m3_to_float(bits: np.ndarray) -> np.ndarray:
    """uint8 OCP E4M3 (fn) bit patterns -> float64 (exact; 0x7f/0xff -> NaN)."""
    b = bits.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return sign * mag


def mxfp4_decode(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weight_packed [out, in/2] u8, weight_scale [out, in/32] u8 -> W [out, in] float64."""
    if packed.dtype != np.uint8 or scale.dtype != np.uint8:
        raise ValueError("mxfp4: weight_packed and weight_scale must be U8")
    n_out, n_in = packed.shape[0], packed.shape[1] * 2
    if n_in % 32 or scale.shape != (n_out, n_in // 32):
        raise ValueError(f"mxfp4: scale shape {scale.shape} does not match packed {packed.shape}")
    if np.any(scale == 255):
        raise ValueError("mxfp4: scale byte 255 (NaN in OCP MX) is not allowed")
    nib = np.empty((n_out, n_in), dtype=np.uint8)
    nib[:, 0::2] = packed & 0x0F          # low nibble = even (first) element
    nib[:, 1::2] = packed >> 4
    val = FP4_MAGNITUDE[nib & 7] * np.where(nib & 8, -1.0, 1.0)   # 0x8 -> -0.0
    return val * np.repeat(np.exp2(scale.astype(np.float64) - 127.0), 32, axis=1)


def canonical_name(name: str) -> str | None:
    if name.startswith(("vision_tower.", "mm_projector.")):
        return None
    if name.startswith("language_model.lm_head."):
        return name[len("language_model."):]
    for prefix in ("language_model.model.", "language_model."):
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return name


def read_safetensors_header(path: pathlib.Path) -> tuple[dict, int]:
    """Returns (header dict without __metadata__, byte offset of the data section)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise ValueError(f"{path}: header length {n} is implausible")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


_RAW_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
               "U8": np.uint8, "I8": np.int8, "I32": np.int32, "I64": np.int64, "F8_E4M3": np.uint8}


class Checkpoint:
    """All canonical tensors of a model directory, decoded on demand (cached)."""

    def __init__(self, model_dir):
        self.dir = pathlib.Path(model_dir)
        self.config = load_config(self.dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self._where = {}   # canonical name -> (path, dtype, shape, begin, end)
        for fname in files:
            path = self.dir / fname
            header, base = read_safetensors_header(path)
            for raw_name, info in header.items():
                name = canonical_name(raw_name)
                if name is None:
                    continue
                if info["dtype"] not in _RAW_DTYPES:
                    raise ValueError(f"{path}: tensor {raw_name}: unsupported dtype {info['dtype']}")
                b, e = info["data_offsets"]
                self._where[name] = (path, info["dtype"], tuple(info["shape"]), base + b, base + e)
        self._cache = {}

    def names(self):
        return sorted(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def dtype(self, name: str) -> str:
        return self._where[name][1]

    def raw(self, name: str) -> np.ndarray:
        """The stored values: floats decoded to float64, integers as stored."""
        if name not in self._cache:
            if name not in self._where:
                raise KeyError(f"{self.dir}: missing tensor {name}")
            path, dtype, shape, b, e = self._where[name]
            with open(path, "rb") as f:
                f.seek(b)
                buf = f.read(e - b)
            raw = np.frombuffer(buf, dtype=_RAW_DTYPES[dtype])
            if raw.size != int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"{path}: tensor {name}: {e - b} bytes do not match shape {shape}")
            raw = raw.reshape(shape)
            if dtype == "BF16":
                raw = bf16_bits_to_float(raw)
            elif dtype == "F8_E4M3":
                raw = f8_e4m3_to_float(raw)
            elif dtype in ("F16", "F32", "F64"):
                raw = raw.astype(np.float64)
            self._cache[name] = raw
        return self._cache[name]

    def weight(self, prefix: str) -> np.ndarray:
        """`prefix.weight` as float64, or the MXFP4 pair `prefix.weight_packed` + `.weight_scale` decoded."""
        if self.has(prefix + ".weight_packed"):
            key = prefix + ".weight(mxfp4)"
            if key not in self._cache:
                self._cache[key] = mxfp4_decode(self.raw(prefix + ".weight_packed"),
                                                self.raw(prefix + ".weight_scale"))
            return self._cache[key]
        return self.raw(prefix + ".weight")

    def get(self, name: str) -> np.ndarray:
        """A tensor by canonical name; `X` also finds the expert weight pair X.weight_packed/X.weight_scale."""
        if self.has(name):
            return self.raw(name)
        if self.has(name + ".weight_packed") or self.has(name + ".weight"):
            return self.weight(name)
        raise KeyError(f"{self.dir}: missing tensor {name}")
