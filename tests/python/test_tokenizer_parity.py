"""Tokenizer parity: `k3 tokenize` must give the ids of a tiktoken.Encoding built from the same files.

Reference (what Kimi's tokenization_kimi.py does, FORMATS.md §1):
  text = bytes.decode("utf-8", "replace")
  for each 400,000-char window, for each slice cut at same-class (str.isspace) runs > 25,000:
      ids += enc.encode(slice, allowed_special=..., disallowed_special=())
Corpus: tests/python/tokenizer_corpus.py (English, CJK, code, emoji, digits, whitespace, contractions, marks),
plus invalid UTF-8 (through `-f FILE`) and inputs that trip the long-input guard. Also a Unicode sweep: every
code point assigned in Python's unicodedata, in context, so PCRE2's classes are compared with tiktoken's.
"""
import base64
import json
import os
import pathlib
import subprocess
import sys
import unicodedata

import pytest
import tiktoken

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
import tokenizer_corpus  # noqa: E402
from train_bpe import PAT_STR  # noqa: E402

TOKENIZERS = ["tokenizer-test", "tokenizer-tiny-k2", "tokenizer-tiny-k3"]
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


def load_encoding(d):
    ranks = {}
    with open(d / "tiktoken.model", "rb") as f:
        for line in f:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    n_base = len(ranks)
    names = {i: f"<|reserved_token_{i}|>" for i in range(n_base, n_base + 256)}
    for k, v in cfg.get("added_tokens_decoder", {}).items():
        names[int(k)] = v["content"]
    specials = {name: i for i, name in names.items()}
    return tiktoken.Encoding(name=d.name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


def guard_slices(s):
    for w in range(0, len(s), MAX_ENCODE_CHARS):
        window = s[w:w + MAX_ENCODE_CHARS]
        run, is_space, start = 0, window[0].isspace(), 0
        for i, ch in enumerate(window):
            sp = ch.isspace()
            if sp != is_space:
                run, is_space = 1, sp
            else:
                run += 1
                if run > MAX_RUN_CHARS:
                    yield window[start:i]
                    start, run = i, 1
        yield window[start:]


def reference(enc, text, special=False):
    ids = []
    for piece in guard_slices(text):
        ids += enc.encode(piece, allowed_special="all" if special else set(), disallowed_special=())
    return ids


def k3_jsonl(k3_bin, d, lines, tmp_path, special=False):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in lines), encoding="utf-8")
    cmd = [k3_bin, "tokenize", "-m", str(d), "-f", str(src), "--jsonl"] + (["--special"] if special else [])
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode()
    got = [json.loads(x) for x in out.splitlines()]
    assert len(got) == len(lines)
    return got


def k3_file(k3_bin, d, data, tmp_path, special=False):
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    cmd = [k3_bin, "tokenize", "-m", str(d), "-f", str(src)] + (["--special"] if special else [])
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode().strip()
    return [int(x) for x in out.split(",")] if out else []


def assert_same(got, want, lines):
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad:
        i = bad[0]
        pytest.fail(f"{len(bad)} of {len(lines)} differ; first {lines[i]!r}:\n engine {got[i]}\n tiktoken {want[i]}")


@pytest.fixture(scope="module", params=TOKENIZERS)
def tok(request, root):
    d = root / "tests" / "data" / request.param
    return d, load_encoding(d)


@pytest.mark.parametrize("special", [False, True])
def test_corpus_matches_tiktoken(k3_bin, tok, tmp_path, special):
    d, enc = tok
    lines = tokenizer_corpus.parity_lines(seed=0 if not special else 3)
    want = [reference(enc, s, special) for s in lines]
    assert_same(k3_jsonl(k3_bin, d, lines, tmp_path, special), want, lines)


def test_specials_follow_the_flag(k3_bin, tok, tmp_path):
    d, enc = tok
    names = [n for n in enc.special_tokens_set if not n.startswith("<|reserved_token_")][:6]
    reserved = min(i for i in range(enc.n_vocab - 256, enc.n_vocab)
                   if enc.decode_single_token_bytes(i).startswith(b"<|reserved_token_"))
    text = "x" + "y ".join(names) + f"<|reserved_token_{reserved}|>"
    on, off = k3_jsonl(k3_bin, d, [text], tmp_path, True)[0], k3_jsonl(k3_bin, d, [text], tmp_path)[0]
    assert on == reference(enc, text, True)
    assert off == reference(enc, text, False)
    assert reserved in on and max(off) < enc.n_vocab - 256


def test_invalid_utf8_is_replaced_like_python(k3_bin, tok, tmp_path):
    d, enc = tok
    for data in tokenizer_corpus.invalid_utf8_samples():
        want = reference(enc, data.decode("utf-8", errors="replace"))
        assert k3_file(k3_bin, d, data, tmp_path) == want, data


def test_long_input_guard(k3_bin, tok, tmp_path):
    d, enc = tok
    texts = tokenizer_corpus.long_texts()
    want = [reference(enc, s) for s in texts]
    got = k3_jsonl(k3_bin, d, texts, tmp_path)
    assert_same(got, want, [s[:40] + "..." for s in texts])
    # The guard really cuts: on some of these inputs plain tiktoken (no guard) gives other ids.
    assert any(w != enc.encode(s, disallowed_special=()) for w, s in zip(want, texts))


def test_unicode_sweep(k3_bin, root, tmp_path):
    """Every code point Python's unicodedata assigns, in letter/digit/space contexts."""
    d = root / "tests" / "data" / "tokenizer-test"
    enc = load_encoding(d)
    cps = [c for c in range(0x110000)
           if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    lines = []
    for k in range(0, len(cps), 48):
        chunk = "".join(chr(c) for c in cps[k:k + 48])
        lines.append(chunk)
        lines.append("a".join(chr(c) for c in cps[k:k + 48]) + "1 x")
        lines.append(" ".join(chr(c) + "B's" for c in cps[k:k + 24]))
    want = [reference(enc, s) for s in lines]
    assert_same(k3_jsonl(k3_bin, d, lines, tmp_path), want, lines)


def test_round_trip(k3_bin, tok, tmp_path):
    d, enc = tok
    lines = [s for s in tokenizer_corpus.parity_lines(seed=5, n=300) if s]
    ids = k3_jsonl(k3_bin, d, lines, tmp_path)
    for s, i in zip(lines[:60], ids[:60]):
        out = subprocess.run([k3_bin, "detokenize", "-m", str(d), "--ids", ",".join(map(str, i))],
                             capture_output=True, check=True).stdout
        assert out.decode("utf-8") == s
    for s, i in zip(lines, ids):
        assert enc.decode_bytes(i) == s.encode("utf-8")
