"""Memory of `k3 run` (issue 3): the weights stay mmapped (file-backed pages, no anonymous copy), and a long
generation does not grow the resident set beyond the per-sequence cache `k3 info` computes.

The process is sampled through /proc/<pid>/status (bench/memory_probe.py); the peak RSS is its VmHWM.
"""
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from memory_probe import info_sizes, run_sampled  # noqa: E402

MiB = 1 << 20
# The cache vectors grow by doubling, so their resident size is up to 2x the cache bytes (measured on
# k3-tiny over 1500 tokens: 2.3 KB per token of anonymous growth for a 960 B/token cache). On top of that,
# allocator and sampling noise; the logits of one step of tiny-k3 are 5 KiB: a per-token leak of one
# logits row over 300 tokens would be 1.5 MiB.
CAPACITY = 2
SLACK = 1 * MiB


def generate(k3_bin, model, n, tmp_path):
    out = tmp_path / f"ids{n}.npy"
    cmd = [k3_bin, "run", "-m", str(model), "-p", "It was a bright morning when", "-n", str(n),
           "--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7", "-c", "2048",
           "-t", "2", "--tokens-out", str(out)]
    rc, _, err, samples, peak = run_sampled(cmd)
    assert rc == 0, err
    return int(np.load(out).size), samples, peak


def test_long_generation_does_not_grow(k3_bin, root, tmp_path):
    model = root / "models" / "tiny-k3"
    per_tok, _, _ = info_sizes(k3_bin, model)
    n_short, _, peak_short = generate(k3_bin, model, 100, tmp_path)
    n_long, samples, peak_long = generate(k3_bin, model, 400, tmp_path)
    assert n_long >= n_short + 200, f"the seed stopped early: {n_short} / {n_long} tokens"
    allowed = CAPACITY * (n_long - n_short) * per_tok + SLACK
    grew = peak_long - peak_short
    assert grew <= allowed, f"peak RSS grew {grew} B from {n_short} to {n_long} tokens (allowed {allowed} B)"
    # Within the long run: anonymous memory after the first quarter grows by at most the cache.
    anon = [s["RssAnon"] for _, s in samples]
    assert len(anon) >= 8, "too few samples"
    q = len(anon) // 4
    late_growth = max(anon[q:]) - anon[q]
    assert late_growth <= CAPACITY * n_long * per_tok + SLACK, f"RssAnon grew {late_growth} B: {anon[q::q]}"


def test_weights_are_mapped_not_copied(k3_bin, root, tmp_path):
    model = root / "models" / "k3-tiny"
    if not (model / "config.json").exists():
        pytest.skip("models/k3-tiny is not in the tree (moved aside for a device call?)")
    per_tok, kda, weights = info_sizes(k3_bin, model)
    n, samples, peak = generate(k3_bin, model, 64, tmp_path)
    anon = max(s["RssAnon"] for _, s in samples)
    file_backed = max(s["RssFile"] for _, s in samples)
    # Decoding touches every weight but the unused embedding rows: most of the file is resident, mapped.
    assert file_backed >= weights // 2, f"RssFile {file_backed} B for {weights} B of weights"
    # No anonymous copy of the weights: the anonymous set stays well under their size.
    assert anon < weights // 2, f"RssAnon {anon} B with {weights} B of weights (a copy?)"
    assert peak <= file_backed + anon + 8 * MiB
