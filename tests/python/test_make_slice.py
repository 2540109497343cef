"""scripts/make_k3_slice.py: value pools, --exact and --like (the K3.1 slice made from a K3 slice).

The tiny widths (--tiny) take the same code path as the 57.6 GB slice. Checked: --like writes only the
indexer tensors and gives every tensor the same bytes as a direct --dsa run; pooled tensors keep their
initializer's range; --exact still draws every tensor on its own.
"""
import json
import pathlib
import struct
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def make(out, *args):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_k3_slice.py"), "--out", str(out), "--tiny",
                        "--jobs", "2", "--experts", "4", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def tensors(d):
    """{name: (dtype, shape, bytes)} over the index's shards."""
    idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for f in sorted(set(idx.values())):
        raw = (d / f).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        h = json.loads(raw[8:8 + n])
        for name, v in h.items():
            if name == "__metadata__":
                continue
            a, b = v["data_offsets"]
            out[name] = (v["dtype"], v["shape"], raw[8 + n + a:8 + n + b])
    assert set(out) == set(idx), "index and shards disagree"
    return out


def test_like_equals_direct(tmp_path):
    k3 = make(tmp_path / "k3")
    like = make(tmp_path / "k31_like", "--dsa", "--like", str(k3))
    direct = make(tmp_path / "k31", "--dsa")
    a, b, base = tensors(like), tensors(direct), tensors(k3)
    assert set(a) == set(b) and set(base) < set(a)
    for name in b:
        assert a[name] == b[name], name
    extra = [f for f in like.iterdir() if f.name.startswith("model-extra")]
    shared = [f for f in like.iterdir() if f.is_symlink()]
    assert extra and shared and all(f.resolve().parent == k3.resolve() for f in shared)
    written = {n for n in a if n not in base}
    assert written and all(".indexer." in n for n in written), written


def test_pools_keep_ranges_and_exact_differs(tmp_path):
    pooled = tensors(make(tmp_path / "p"))
    exact = tensors(make(tmp_path / "e", "--exact"))
    assert set(pooled) == set(exact)
    for name, (dt, shape, raw) in pooled.items():
        if dt != "BF16" or len(raw) < 1 << 16 or "norm" in name:
            continue
        x = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        y = (np.frombuffer(exact[name][2], np.uint16).astype(np.uint32) << 16).view(np.float32)
        assert np.isfinite(x).all()
        assert abs(x.std() / y.std() - 1) < 0.05, name   # the same distribution
        assert abs(np.abs(x).max() / np.abs(y).max() - 1) < 0.05, name
        assert raw != exact[name][2], name              # but other draws
    # MXFP4 scales stay in the 2^-8 .. 2^-7 bytes
    s = [v[2] for n, v in pooled.items() if n.endswith("weight_scale")]
    assert s and set(np.frombuffer(b"".join(s), np.uint8)) <= {119, 120}
