"""`k3 info -m DIR` on the tiny checkpoints: family, the per-layer map, sizes, and clear errors.

The expected layer map is derived here from each model's config.json (1-based full_attn_layers,
first_k_dense_replace, moe_layer_freq, attn_res_block_size), independently of the C++ parser.
"""
import json
import re
import shutil
import subprocess

import pytest

MODELS = {"tiny-kl": "kimi_linear", "tiny-k3": "kimi_k3", "tiny-k31": "kimi_k3.1"}


def run_info(k3_bin, *args):
    return subprocess.run([k3_bin, "info", *args], capture_output=True, text=True, timeout=60)


def expected_layers(cfg):
    t = cfg.get("text_config", cfg)
    full = set(t["linear_attn_config"]["full_attn_layers"])
    big = "DSA" if "dsa_config" in t else "MLA"
    S = t.get("attn_res_block_size", 0)
    lines = []
    for i in range(t["num_hidden_layers"]):
        kind = big if (i + 1) in full else "KDA"
        ffn = "MoE" if i >= t["first_k_dense_replace"] and i % t["moe_layer_freq"] == 0 else "dense"
        lines.append(f"layer {i}: {kind} {ffn}" + (f" block {i // S}" if S else ""))
    return lines


@pytest.mark.parametrize("name", sorted(MODELS))
def test_info_layer_map(k3_bin, root, name):
    d = root / "models" / name
    r = run_info(k3_bin, "-m", str(d))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"family: {MODELS[name]}" in out
    cfg = json.loads((d / "config.json").read_text())
    got = [l.strip() for l in out.splitlines() if l.strip().startswith("layer ")]
    assert got == expected_layers(cfg)
    # Parameter counts: active < total (routed experts), both positive.
    m = re.search(r"params: total (\d+) .*active per token (\d+)", out)
    assert m, out
    total, active = int(m.group(1)), int(m.group(2))
    assert 0 < active < total
    assert "KDA state per sequence" in out and "weights by dtype" in out
    if name != "tiny-kl":
        assert "U8" in out and "experts MXFP4" in out
        assert "skipped 3 vision tensors" in r.stderr


def test_info_total_params_match_the_files(k3_bin, root):
    # tiny-kl is all bf16/fp32 with no extra tensors: total params = sum of numel over the file.
    import struct
    data = (root / "models" / "tiny-kl" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    numel = 0
    for k, v in header.items():
        if k != "__metadata__":
            p = 1
            for s in v["shape"]:
                p *= s
            numel += p
    out = run_info(k3_bin, "-m", str(root / "models" / "tiny-kl")).stdout
    assert f"params: total {numel} " in out


def test_info_errors(k3_bin, root, tmp_path):
    r = run_info(k3_bin)
    assert r.returncode != 0 and "--model" in r.stderr
    r = run_info(k3_bin, "-m", str(tmp_path / "nope"))
    assert r.returncode == 1 and "config.json" in r.stderr and "not found" in r.stderr
    d = tmp_path / "broken"
    shutil.copytree(root / "models" / "tiny-k31", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["dsa_config"]["index_topk_freq"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    r = run_info(k3_bin, "-m", str(d))
    assert r.returncode == 1
    assert "index_topk_freq = 4 is not supported" in r.stderr
