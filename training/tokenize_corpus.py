#!/usr/bin/env python3
"""tokenize_corpus.py: corpus JSONL -> uint16 token arrays with the trained Kimi-style tokenizer.

Tokenizer: DIR/tiktoken.model (base64 bytes SP rank) + DIR/tokenizer_config.json (added_tokens_decoder,
ids n_base..n_base+255), encoded with tiktoken using the exact Kimi pat_str (FORMATS.md §1.2).
Marker spellings: in documents whose src is "chat", the spellings in MARKERS are cut out of the text
and replaced by their special ids; the text between them is encoded as ordinary BPE (the K3 renderer's
segment rule, FORMATS.md §1.1). Prose documents are encoded as plain text only (no special parsing).
Stream layout: every prose document is [BOS] + BPE(text); chat documents are BPE/marker segments
with no BOS (the K3 chat format has none), each message ending in <|end_of_msg|>.
Output: OUT/train.npy, OUT/val.npy (uint16, 1-D) and OUT/meta.json {n_base, n_vocab, ids, counts}; and the
engine-comparable held-out text OUT/val_eval.txt with its encoding OUT/val_eval.npy (write_eval_text).
Usage: tokenize_corpus.py --corpus .carry/corpus --tokenizer .carry/tokenizer --out .carry/data
"""
import argparse
import base64
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from train_bpe import PAT_STR  # noqa: E402  (the one definition of the Kimi pre-tokenizer)

MARKERS = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
EVAL_MAX_CHARS = 380_000


def load_tokenizer(tok_dir: str):
    """Returns (tiktoken.Encoding, {special name: id}, n_base)."""
    import tiktoken
    ranks = {}
    with open(os.path.join(tok_dir, "tiktoken.model")) as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    n_base = len(ranks)
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        added = json.load(f)["added_tokens_decoder"]
    specials = {v["content"]: int(k) for k, v in added.items()}
    if min(specials.values()) != n_base or len(specials) != 256:
        raise ValueError(f"{tok_dir}: specials must be the 256 ids {n_base}..{n_base + 255}")
    enc = tiktoken.Encoding(name="k3-small", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    return enc, specials, n_base


def encode_chat(enc, specials, text: str) -> list:
    ids = []
    pattern = "(" + "|".join(re.escape(m) for m in MARKERS) + ")"
    for piece in re.split(pattern, text):
        if piece in MARKERS:
            ids.append(specials[piece])
        elif piece:
            ids.extend(enc.encode_ordinary(piece))
    return ids


def encode_doc(enc, specials, doc) -> list:
    if doc["src"] == "chat":
        return encode_chat(enc, specials, doc["text"])
    return [specials["[BOS]"]] + enc.encode_ordinary(doc["text"])


def write_eval_text(enc, corpus: str, out: str, max_chars: int = EVAL_MAX_CHARS) -> dict:
    """OUT/val_eval.txt: held-out prose documents joined by blank lines, whole documents up to max_chars
    code points (below the tokenizer's 400,000-code-point window, so engine and tiktoken cut nothing), and
    OUT/val_eval.npy: its ordinary-text encoding without BOS, what `k3 perplexity -f val_eval.txt` scores."""
    parts, n = [], 0
    with open(os.path.join(corpus, "val.jsonl"), encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if doc["src"] == "chat" or n + len(doc["text"]) + 2 > max_chars:
                continue
            parts.append(doc["text"])
            n += len(doc["text"]) + 2
    text = "\n\n".join(parts) + "\n"
    with open(os.path.join(out, "val_eval.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    ids = np.asarray(enc.encode_ordinary(text), dtype=np.uint16)
    np.save(os.path.join(out, "val_eval.npy"), ids)
    print(f"val_eval.txt: {len(parts)} documents, {len(text)} code points, {ids.size} tokens")
    return {"documents": len(parts), "code_points": len(text), "tokens": int(ids.size)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".carry/corpus")
    ap.add_argument("--tokenizer", default=".carry/tokenizer")
    ap.add_argument("--out", default=".carry/data")
    ap.add_argument("--max-docs", type=int, default=0, help="for smoke tests: first N docs of each split")
    args = ap.parse_args(argv)
    enc, specials, n_base = load_tokenizer(args.tokenizer)
    os.makedirs(args.out, exist_ok=True)
    meta = {"n_base": n_base, "n_vocab": n_base + 256, "ids": {m: specials[m] for m in MARKERS + ["[BOS]", "[EOS]"]}}
    for part in ("train", "val"):
        ids, counts, n_bytes = [], {}, {}
        with open(os.path.join(args.corpus, part + ".jsonl"), encoding="utf-8") as f:
            for i, line in enumerate(f):
                if args.max_docs and i >= args.max_docs:
                    break
                doc = json.loads(line)
                toks = encode_doc(enc, specials, doc)
                ids.extend(toks)
                counts[doc["src"]] = counts.get(doc["src"], 0) + len(toks)
                n_bytes[doc["src"]] = n_bytes.get(doc["src"], 0) + len(doc["text"].encode())
        arr = np.asarray(ids, dtype=np.uint16)
        if arr.size and int(arr.max()) >= n_base + 256:
            raise ValueError("token id out of range")
        np.save(os.path.join(args.out, part + ".npy"), arr)
        meta[part] = {"tokens": int(arr.size), "tokens_by_src": counts, "bytes_by_src": n_bytes}
        print(f"{part}: {arr.size} tokens, {sum(n_bytes.values()) / max(arr.size, 1):.2f} bytes/token")
    meta["val_eval"] = write_eval_text(enc, args.corpus, args.out)
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
