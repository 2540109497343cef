#!/usr/bin/env python3
"""make_k3_slice.py: a K3 / K3.1 checkpoint with K3's full per-layer dimensions and only a few layers.

For the GPU work (issues 7 and 9): real shapes, random weights. The config is docs/configs/kimi-k3.json
(or kimi-k3.1-pro.json with --dsa) with the layer lists cut to --layers (1-based l is MLA/DSA when
l % 4 == 0 or l == L, as in K3: 4 layers = 3 KDA + 1 MLA) and num_experts set to --experts.
Published HF layout: config.json with text_config + quantization_config (compressed-tensors
mxfp4-pack-quantized), tensors language_model.model.* / language_model.lm_head.weight, routed experts as
weight_packed u8 [out, in/2] + weight_scale u8 [out, in/32], shards of at most --shard-gb GB plus
model.safetensors.index.json, the tiny K3 tokenizer (tests/data/tokenizer-tiny-k3; ids past it are
never produced by it, the model vocabulary stays 163840).

Weights (sane scales, activations stay finite): linears uniform with std 1/sqrt(in) in bf16 (fp32 uniform
bits truncated to bf16: fast); norms 1; MXFP4 bytes uniform random (E2M1 rms 2.93) with E8M0 scales
2^-8 or 2^-7 (bytes 119-120), about std 0.016 = 1/sqrt(3584); A_log, dt_bias, conv, o_norm and the router
bias fp32 as MODEL.md says. Deterministic (--seed). Written in parallel (--jobs processes, each pwrite()s its
tensors in place). Fast by default: every tensor over 64 KiB with a random initializer is a rotated window
(offset from a hash of its name) of a 16 MiB pool of values drawn once per initializer, so writing is a memory
copy (the distribution is the same; only bytes 16 MiB apart repeat). --exact draws every tensor on its own.
--like DIR (with --dsa) makes the K3.1 variant next to a K3 slice DIR of the same shape: the shards holding
tensors both have are symlinked and only the indexer tensors are written.

  python3 scripts/make_k3_slice.py --out /tmp/slice                 # 4 layers, 896 experts (~57 GB)
  python3 scripts/make_k3_slice.py --out /tmp/slice31 --dsa         # K3.1: the MLA layer runs DSA
  python3 scripts/make_k3_slice.py --out /tmp/s --experts 32        # ~11 GB
  python3 scripts/make_k3_slice.py --out /tmp/s --tiny              # toy widths, same code path (CI)
  python3 scripts/make_k3_slice.py --out /dev/shm/s31 --dsa --like /dev/shm/s   # K3.1 from a K3 slice
"""
import argparse
import json
import multiprocessing as mp
import os
import pathlib
import shutil
import struct
import sys
import time
import zlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
ST = {"F32": 4, "BF16": 2, "U8": 1}
BLOCK = 1 << 26  # elements generated per step of a large tensor (--exact)
POOL = 1 << 24  # bytes of one initializer's value pool
POOL_MIN = 1 << 16  # tensors at least this large come from a pool (unless --exact)
POOLS = {}  # (dtype, init) -> bytes; made in the parent before the workers fork


# ---------------------------------------------------------------- config
def make_config(a):
    cfg = json.loads((ROOT / "docs" / "configs" / ("kimi-k3.1-pro.json" if a.dsa else "kimi-k3.json")).read_text())
    t = cfg["text_config"]
    L = a.layers
    full = [l for l in range(1, L + 1) if l % 4 == 0 or l == L]
    t["num_hidden_layers"] = L
    t["linear_attn_config"]["full_attn_layers"] = full
    t["linear_attn_config"]["kda_layers"] = [l for l in range(1, L + 1) if l not in full]
    if a.dsa:
        t["dsa_config"]["dsa_layers"] = full
    if a.tiny:  # toy widths: the same tensors and code path in a few MB
        t.update({"hidden_size": 256, "num_attention_heads": 4, "q_lora_rank": 128, "intermediate_size": 512,
                  "moe_intermediate_size": 128, "routed_expert_hidden_size": 128, "vocab_size": 2048})
        t["linear_attn_config"]["num_heads"] = 4
        if a.dsa:
            t["dsa_config"].update({"index_num_heads": 4, "index_topk": 8})
        cfg["vision_config"]["text_hidden_size"] = 256
    if a.vocab:
        t["vocab_size"] = a.vocab
    if a.experts:
        t["num_experts"] = a.experts
    t["num_experts_per_token"] = min(t["num_experts_per_token"], t["num_experts"])
    if t["vocab_size"] < 163840:  # the special ids of the tiny K3 tokenizer (1024 ranks + 256 specials)
        ids = {"bos_token_id": 1024, "eos_token_id": 1026, "pad_token_id": 1279}
        t.update(ids)
        cfg.update(ids)
        cfg["media_placeholder_token_id"] = 1045
    return cfg


# ---------------------------------------------------------------- tensor list: (name, dtype, shape, init)
def tensor_specs(cfg):
    t = cfg["text_config"]
    D, L, V = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    la = t["linear_attn_config"]
    H, K, W, R = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"], 128  # R: KDA gate rank
    nh, qr, kvr = t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"]
    dn, dr, dv = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    E, F, Fd, lat = t["num_experts"], t["moe_intermediate_size"], t["intermediate_size"], t["routed_expert_hidden_size"]
    Fs = t["num_shared_experts"] * F
    dsa = t.get("dsa_config")
    HK = H * K
    s = []

    def lin(name, out, inp, gain=1.0):
        s.append((name, "BF16", [out, inp], ("uniform", gain / np.sqrt(inp))))

    def norm(name, n, dt="BF16"):
        s.append((name, dt, [n], ("const", 1.0)))

    s.append(("model.embed_tokens.weight", "BF16", [V, D], ("uniform", 1.0)))
    norm("model.norm.weight", D)
    lin("lm_head.weight", V, D)
    s.append(("model.output_attn_res_proj.weight", "BF16", [1, D], ("uniform", 0.02)))
    norm("model.output_attn_res_norm.weight", D)
    for i in range(L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", D)
        norm(p + "post_attention_layernorm.weight", D)
        for r in ("self_attention_res", "mlp_res"):
            s.append((p + r + "_proj.weight", "BF16", [1, D], ("uniform", 0.02)))
            norm(p + r + "_norm.weight", D)
        a = p + "self_attn."
        if (i + 1) in la["kda_layers"]:
            for x in "qkv":
                lin(a + f"{x}_proj.weight", HK, D)
                s.append((a + f"{x}_conv1d.weight", "F32", [HK, 1, W], ("uniform", 0.5)))
            lin(a + "f_a_proj.weight", R, D)
            lin(a + "f_b_proj.weight", HK, R, 0.5)
            lin(a + "b_proj.weight", H, D)
            s.append((a + "dt_bias", "F32", [HK], ("range", -3.0, 0.0)))
            s.append((a + "A_log", "F32", [max(H, K)], ("a_log", H)))
            lin(a + "g_proj.weight", HK, D)
            norm(a + "o_norm.weight", K, "F32")
            lin(a + "o_proj.weight", D, HK)
        else:
            lin(a + "q_a_proj.weight", qr, D)
            norm(a + "q_a_layernorm.weight", qr)
            lin(a + "q_b_proj.weight", nh * (dn + dr), qr)
            lin(a + "kv_a_proj_with_mqa.weight", kvr + dr, D)
            norm(a + "kv_a_layernorm.weight", kvr)
            lin(a + "kv_b_proj.weight", nh * (dn + dv), kvr)
            lin(a + "o_proj.weight", D, nh * dv)
            lin(a + "g_proj.weight", nh * dv, D)
            if dsa:
                ih, idh = dsa["index_num_heads"], dsa["index_head_dim"]
                lin(a + "indexer.wq_b.weight", ih * idh, qr)
                lin(a + "indexer.wk.weight", idh, D)
                lin(a + "indexer.weights_proj.weight", ih, D)
                norm(a + "indexer.k_norm.weight", idh, "F32")
                s.append((a + "indexer.k_norm.bias", "F32", [idh], ("uniform", 0.1)))
        if i < t["first_k_dense_replace"] or i % t["moe_layer_freq"] != 0:
            lin(p + "mlp.gate_proj.weight", Fd, D)
            lin(p + "mlp.up_proj.weight", Fd, D)
            lin(p + "mlp.down_proj.weight", D, Fd)
            continue
        m = p + "block_sparse_moe."
        lin(m + "gate.weight", E, D)
        s.append((m + "gate.e_score_correction_bias", "F32", [E], ("uniform", 0.01)))
        lin(m + "shared_experts.gate_proj.weight", Fs, D)
        lin(m + "shared_experts.up_proj.weight", Fs, D)
        lin(m + "shared_experts.down_proj.weight", D, Fs)
        lin(m + "routed_expert_down_proj.weight", lat, D)
        norm(m + "routed_expert_norm.weight", lat)
        lin(m + "routed_expert_up_proj.weight", D, lat)
        for e in range(E):
            for w, (o, n) in (("w1", (F, lat)), ("w3", (F, lat)), ("w2", (lat, F))):
                s.append((m + f"experts.{e}.{w}.weight_packed", "U8", [o, n // 2], ("bytes",)))
                s.append((m + f"experts.{e}.{w}.weight_scale", "U8", [o, n // 32], ("scale", 119, 120)))
    # published K3 names
    return [("language_model.lm_head.weight" if n == "lm_head.weight" else "language_model." + n, dt, sh, ini)
            for n, dt, sh, ini in s]


# ---------------------------------------------------------------- values
def generate(rng, dt, n, ini):
    """n values of a tensor as bytes (a block of it for the element-wise initializers)."""
    kind = ini[0]
    if kind == "bytes":
        return rng.bytes(n)
    if kind == "scale":
        return rng.integers(ini[1], ini[2], size=n, endpoint=True, dtype=np.uint8).tobytes()
    if kind == "uniform":  # std ini[1]: uniform in +-sqrt(3) std
        x = rng.random(n, dtype=np.float32)
        x *= np.float32(2.0 * np.sqrt(3.0) * ini[1])
        x -= np.float32(np.sqrt(3.0) * ini[1])
    elif kind == "range":
        x = rng.uniform(ini[1], ini[2], n).astype(np.float32)
    elif kind == "const":
        x = np.full(n, ini[1], np.float32)
    elif kind == "a_log":  # g = -5 sigmoid(exp(A_log) z): A_log[:H] = log U(0.5, 2), tail 0 (MODEL.md §4)
        x = np.zeros(n, np.float32)
        x[: ini[1]] = np.log(rng.uniform(0.5, 2.0, ini[1]))
    else:
        raise ValueError(kind)
    if dt == "F32":
        return x.tobytes()
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # bf16 by truncation


def pool_key(dt, numel, ini, exact):
    if exact or numel * ST[dt] < POOL_MIN or ini[0] not in ("bytes", "scale", "uniform"):
        return None
    return (dt, ini)


def make_pools(specs, seed, exact):
    for _name, dt, shape, ini in specs:
        k = pool_key(dt, int(np.prod(shape)), ini, exact)
        if k is not None and k not in POOLS:
            rng = np.random.default_rng([seed, zlib.crc32(repr(k).encode())])
            POOLS[k] = generate(rng, dt, POOL // ST[dt], ini)


def write_job(job):
    """job: (path, exact, [(offset, name, dtype, numel, init, seed)]): pwrite each tensor in blocks."""
    path, exact, items = job
    fd = os.open(path, os.O_WRONLY)
    try:
        for off, name, dt, numel, ini, seed in items:
            k = pool_key(dt, numel, ini, exact)
            if k is not None:  # a rotated window of the pool, repeated
                pool, es = memoryview(POOLS[k]), ST[dt]
                pos, nb, p0 = 0, numel * es, (zlib.crc32(name.encode()) % (POOL // es)) * es
                while pos < nb:
                    a = (p0 + pos) % POOL
                    n = min(POOL - a, nb - pos)
                    os.pwrite(fd, pool[a : a + n], off + pos)
                    pos += n
                continue
            rng = np.random.default_rng(seed)
            done = 0
            step = numel if ini[0] == "a_log" else BLOCK
            while done < numel:
                n = min(step, numel - done)
                b = generate(rng, dt, n, ini)
                os.pwrite(fd, b, off + done * ST[dt])
                done += n
    finally:
        os.close(fd)
    return sum(numel * ST[dt] for _, _, dt, numel, _, _ in items)


def reuse_shards(like, specs):
    """Tensors of the K3 slice `like` that the new checkpoint shares: {name: file}, checked by dtype and shape."""
    idx = json.loads((like / "model.safetensors.index.json").read_text())["weight_map"]
    headers = {}
    for f in set(idx.values()):
        with open(like / f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            headers[f] = json.loads(fh.read(n))
    shared = {}
    for name, dt, shape, _ in specs:
        f = idx.get(name)
        if f and headers[f][name]["dtype"] == dt and headers[f][name]["shape"] == shape:
            shared[name] = f
    return shared


# ---------------------------------------------------------------- layout and main
def plan_shards(specs, limit):
    shards, cur, size = [], [], 0
    for sp in specs:
        b = int(np.prod(sp[2])) * ST[sp[1]]
        if cur and size + b > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(sp)
        size += b
    if cur:
        shards.append(cur)
    return shards


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (replaced)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=0, help="routed experts (default: K3's 896; --tiny: 32)")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary (default 163840)")
    ap.add_argument("--dsa", action="store_true", help="K3.1: the MLA layers run DSA (dsa_config, indexer)")
    ap.add_argument("--tiny", action="store_true", help="toy widths (d_model 256, 4 heads) for CI")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--exact", action="store_true", help="draw every tensor on its own (slow; no value pools)")
    ap.add_argument("--like", default="", help="a K3 slice of the same shape: symlink the shards it shares")
    a = ap.parse_args()
    if a.tiny and not a.experts:
        a.experts = 32
    if a.layers < 1 or a.experts < 0 or a.experts > 4096 or (a.vocab and a.vocab < 1280):
        sys.exit("make_k3_slice: --layers >= 1, 0 < --experts <= 4096, --vocab >= 1280 (the tokenizer's ids)")
    t0 = time.time()
    cfg = make_config(a)
    specs = tensor_specs(cfg)
    out = pathlib.Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weight_map, total = {}, 0
    if a.like:  # the shared tensors stay in the K3 slice's shards (symlinked), the rest go to new ones
        like = pathlib.Path(a.like).resolve()
        shared = reuse_shards(like, specs)
        for f in sorted(set(shared.values())):
            os.symlink(like / f, out / f)
            with open(like / f, "rb") as fh:
                total += os.path.getsize(like / f) - 8 - struct.unpack("<Q", fh.read(8))[0]
        weight_map.update(shared)
        specs = [sp for sp in specs if sp[0] not in shared]
    make_pools(specs, a.seed, a.exact)
    shards = plan_shards(specs, int(a.shard_gb * 1e9))
    stem = "model-extra" if a.like else "model"
    files = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    jobs, written_total = [], 0
    for fname, part in zip(files, shards):
        part = sorted(part, key=lambda sp: -ST[sp[1]])  # by element size: every tensor aligned
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dt, shape, _ in part:
            b = int(np.prod(shape)) * ST[dt]
            header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + b]}
            off += b
            weight_map[name] = fname
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        path = str(out / fname)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            f.truncate(8 + len(h) + off)
        base, items, size = 8 + len(h), [], 0
        for name, dt, shape, ini in part:  # jobs of ~256 MB
            n = int(np.prod(shape))
            seed = [a.seed, zlib.crc32(name.encode())]
            items.append((base + header[name]["data_offsets"][0], name, dt, n, ini, seed))
            size += n * ST[dt]
            if size >= 1 << 28:
                jobs.append((path, a.exact, items))
                items, size = [], 0
        if items:
            jobs.append((path, a.exact, items))
        total += off
        written_total += off
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    tok = ROOT / "tests" / "data" / "tokenizer-tiny-k3"
    for f in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(tok / f, out / f)
    jobs.sort(key=lambda j: -sum(it[3] * ST[it[2]] for it in j[2]))  # largest first
    with mp.get_context("fork").Pool(max(1, a.jobs)) as pool:
        written = sum(pool.imap_unordered(write_job, jobs))
    assert written == written_total, (written, written_total)
    dt = time.time() - t0
    print(f"{out}: {len(weight_map)} tensors, {total / 1e9:.2f} GB, {written / 1e9:.2f} GB written in "
          f"{len(files)} shard(s), {dt:.1f} s ({written / 1e9 / max(dt, 1e-9):.2f} GB/s)")


if __name__ == "__main__":
    main()
