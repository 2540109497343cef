#!/usr/bin/env python3
"""train_bpe.py: a byte-level BPE trainer that writes a Kimi-style tokenizer directory.

Output (FORMATS.md §1.1):
  DIR/tiktoken.model          base64(token_bytes) SP rank LF; ranks dense 0..n_base-1; ranks 0..255 are
                              the 256 single bytes, then merges in training order.
  DIR/tokenizer_config.json   added_tokens_decoder for the 256 reserved ids n_base..n_base+255, named with the
                              K2 or K3 names at the same offsets from n_base as the real ids sit from 163584
                              (FORMATS.md §1.3); unnamed ones are <|reserved_token_{id}|>. Plus bos/eos/pad/unk.

Training: the text is pre-tokenized with the exact Kimi pat_str (Python `regex`, V1 flag so `&&` is a class
intersection). BPE runs over the unique pre-token words weighted by their counts:
  count(a, b) = sum over words w of freq(w) * #occurrences of the adjacent pair (a, b) in w
  repeat: (a, b) = argmax count (ties: smallest concatenated bytes); new token ab; rewrite only the words that
  contain (a, b) and update the pair counts incrementally (a lazy max-heap holds the candidates).
A merge whose bytes already exist (e.g. "a"+"bc" after "ab"+"c") reuses the token without a new rank.

Usage:
  tools/train_bpe.py --vocab 1024 --layout k3 --out DIR INPUT... [--max-bytes N]
INPUT is a file or a directory (read recursively; files that are not UTF-8 text are skipped; .gz is read).
"""
import argparse
import base64
import collections
import gzip
import heapq
import json
import os
import sys

import regex

PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

N_RESERVED = 256
# Offsets from n_base (real ids: 163584 + offset), FORMATS.md §1.3.
COMMON_NAMES = {0: "[BOS]", 1: "[EOS]", 6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]",
                18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
                254: "[UNK]", 255: "[PAD]"}
K2_NAMES = {2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 10: "<|im_system|>",
            11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
            14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
            22: "<think>", 23: "</think>"}
K3_NAMES = {2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>"}


def pat():
    return regex.compile(PAT_STR, regex.V1)


def read_texts(inputs, max_bytes):
    """Yields decoded texts from files/directories until max_bytes of UTF-8 have been read."""
    total = 0
    paths = []
    for inp in inputs:
        if os.path.isdir(inp):
            for d, _, files in sorted(os.walk(inp)):
                paths += [os.path.join(d, f) for f in sorted(files)]
        else:
            paths.append(inp)
    for p in paths:
        if total >= max_bytes or os.path.islink(p) or not os.path.isfile(p):
            continue
        try:
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rb") as f:
                raw = f.read(min(max_bytes - total, 1 << 30))
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if "\0" in text:
            continue
        total += len(raw)
        yield text


def count_words(texts):
    counter = collections.Counter()
    rx = pat()
    for t in texts:
        counter.update(rx.findall(t))
    words = collections.Counter()
    for w, c in counter.items():
        words[w.encode("utf-8")] += c
    return words


def train(words, n_ranks):
    """words: {bytes: count}. Returns the list of token byte strings in rank order (len n_ranks at most)."""
    vocab = [bytes([i]) for i in range(256)]          # token id -> bytes (ids == ranks here)
    index = {b: i for i, b in enumerate(vocab)}
    seqs = [list(w) for w in words]                   # each word as token ids
    freqs = list(words.values())
    pair_count = collections.defaultdict(int)
    where = collections.defaultdict(set)              # pair -> word indices that (may) contain it
    for wi, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += freqs[wi]
            where[(a, b)].add(wi)

    def key(pair):
        return (-pair_count[pair], vocab[pair[0]] + vocab[pair[1]], pair)

    heap = [key(p) for p in pair_count]
    heapq.heapify(heap)
    while len(vocab) < n_ranks and heap:
        negc, _, pair = heapq.heappop(heap)
        cur = pair_count.get(pair, 0)
        if cur <= 0:
            continue
        if -negc != cur:                              # stale entry: re-queue with the true count
            heapq.heappush(heap, key(pair))
            continue
        merged = vocab[pair[0]] + vocab[pair[1]]
        new_id = index.get(merged)
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            index[merged] = new_id
        changed = set()
        for wi in list(where.pop(pair, ())):
            s, f = seqs[wi], freqs[wi]
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == pair[0] and s[i + 1] == pair[1]:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            if len(out) == len(s):
                continue
            for p in zip(s, s[1:]):
                pair_count[p] -= f
            for p in zip(out, out[1:]):
                pair_count[p] += f
                where[p].add(wi)
                changed.add(p)
            seqs[wi] = out
        pair_count.pop(pair, None)
        for p in changed:
            if pair_count.get(p, 0) > 0:
                heapq.heappush(heap, key(p))
    return vocab


def special_names(layout, n_base):
    names = dict(COMMON_NAMES)
    names.update(K2_NAMES if layout == "k2" else K3_NAMES)
    return {n_base + off: names.get(off, f"<|reserved_token_{n_base + off}|>") for off in range(N_RESERVED)}


def write_dir(out, vocab, layout):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tiktoken.model"), "w", encoding="ascii", newline="\n") as f:
        for rank, b in enumerate(vocab):
            f.write(f"{base64.b64encode(b).decode('ascii')} {rank}\n")
    n_base = len(vocab)
    specials = special_names(layout, n_base)
    decoder = {str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for i, name in specials.items()}
    named = [n for n in specials.values() if not n.startswith("<|reserved_token_")]
    cfg = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [n for n in named if n not in ("[BOS]", "[EOS]", "[UNK]", "[PAD]")],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]" if layout == "k2" else "<|end_of_msg|>",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="text files or directories")
    ap.add_argument("--vocab", type=int, required=True, help="number of BPE ranks (>= 256)")
    ap.add_argument("--layout", choices=["k2", "k3"], default="k3")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=1 << 62)
    ap.add_argument("--exact", action="store_true", help="fail unless exactly --vocab ranks were learned")
    args = ap.parse_args(argv)
    if args.vocab < 256:
        ap.error("--vocab must be >= 256")
    words = count_words(read_texts(args.inputs, args.max_bytes))
    vocab = train(words, args.vocab)
    if args.exact and len(vocab) != args.vocab:
        sys.exit(f"train_bpe: only {len(vocab)} ranks learned (corpus too small for {args.vocab})")
    write_dir(args.out, vocab, args.layout)
    print(f"train_bpe: {len(words)} unique words, {len(vocab)} ranks -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
