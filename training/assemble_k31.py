#!/usr/bin/env python3
"""assemble_k31.py: full K3.1 checkpoint folder = K3 folder + the K3.1 delta handed back by the device run.

    python3 training/assemble_k31.py --k3 models/k3-tiny --delta FILES_AT/k31-delta.safetensors --out models/k3.1-tiny

The delta (k31_stages.export_delta) is one safetensors file: every tensor of the MLA/DSA layers' self_attn, the
indexers included, and in its __metadata__ "config.json" the K3.1 config (the K3 one plus
text_config.dsa_config). Every tensor of
the K3 shards is copied byte for byte unless the delta has the same name; the delta's tensors replace or add.
Shards are re-cut at --shard-mib (as export.py: names sorted, a new shard when the next tensor would pass the
limit) with a fresh model.safetensors.index.json; the tokenizer files are copied from the K3 folder. Checks:
the delta's config equals the K3 config apart from dsa_config, every delta name is an MLA-layer self_attn
tensor, and the result holds every K3 name plus the indexers.
"""
import argparse
import json
import os
import shutil
import struct
import sys


def read_raw(path, with_metadata=False):
    """{name: (dtype, shape, bytes)} without decoding (and the __metadata__ map when asked)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
           for k, v in header.items() if k != "__metadata__"}
    return (out, header.get("__metadata__", {})) if with_metadata else out


ELEM = {"F32": 4, "BF16": 2, "U8": 1}


def write_raw(path, tensors):
    """As export.write_safetensors: largest element size first, then by name; header padded to 8 bytes."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    order = sorted(tensors, key=lambda n: (-ELEM[tensors[n][0]], n))
    for name in order:
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in order:
            f.write(tensors[name][2])
    return off


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k3", required=True)
    ap.add_argument("--delta", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shard-mib", type=float, default=15.0)
    args = ap.parse_args(argv)

    k3_cfg = json.load(open(os.path.join(args.k3, "config.json")))
    delta, meta = read_raw(args.delta, with_metadata=True)
    if "config.json" not in meta:
        sys.exit(f"{args.delta}: no config.json in the safetensors metadata")
    cfg = json.loads(meta["config.json"])
    text = dict(cfg["text_config"])
    dsa = text.pop("dsa_config", None)
    if dsa is None or {**cfg, "text_config": text} != k3_cfg:
        sys.exit("the delta's config is not the K3 config plus dsa_config")
    index = json.load(open(os.path.join(args.k3, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(read_raw(os.path.join(args.k3, shard)))
    if set(tensors) != set(index["weight_map"]):
        sys.exit("K3 shards and index disagree")
    mla = tuple(f"language_model.model.layers.{i - 1}.self_attn." for i in dsa["dsa_layers"])
    bad = [n for n in delta if not n.startswith(mla)]
    if bad:
        sys.exit(f"delta tensors outside the DSA layers' self_attn: {bad[:5]}")
    replaced = sum(n in tensors for n in delta)
    tensors.update(delta)

    os.makedirs(args.out, exist_ok=True)
    limit, shards, cur, size = int(args.shard_mib * 2**20), [], {}, 0
    for name in sorted(tensors):
        nbytes = len(tensors[name][2])
        if cur and size + nbytes > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = tensors[name]
        size += nbytes
    shards.append(cur)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = sum(write_raw(os.path.join(args.out, f), s) for f, s in zip(files, shards))
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {n: files[i] for i, s in enumerate(shards) for n in sorted(s)}}, f, indent=1)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.k3, name), os.path.join(args.out, name))
    print(f"{args.out}: {len(tensors)} tensors ({replaced} replaced, {len(delta) - replaced} added) in "
          f"{len(files)} shards, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
