"""Engine logits vs the independent NumPy reference (tests/python/ref) on the tiny checkpoints.

CLI contract exercised (tools/k3/cmd_logits.cpp):
    k3 logits -m DIR --tokens 1,2,3,... -o OUT.npy --precision fp32|bf16 [--decode-path] [--chunk N]
              [--mla absorbed|unabsorbed]
    -> OUT.npy: float32 [T, vocab], the logits of every position of one sequence.
Bounds (NMSE = sum (engine - ref)^2 / sum ref^2):
    fp32: NMSE <= 1e-6 against the exact-math reference, and every position's own NMSE <= 1e-5
          (so an error confined to a few positions, e.g. one decode step, cannot hide in the average);
    bf16: median over 12 short sequences of NMSE <= 1e-3 against the bf16-rounding reference in the same
          MLA form (values printed; run with -s). Why a median: see BF16_CASES.
Cases: every model one-shot; sequences past the K3.1 index_topk (8) several times (70 tokens) and across
more than one 64-token KDA chunk (150 tokens); the token-by-token decode path; chunked prefill; both MLA forms.
A failing or missing `k3 logits` fails these tests (it never skips them).
"""
import functools
import subprocess

import numpy as np
import pytest

import ref

MODELS = ["tiny-kl", "tiny-k3", "tiny-k31"]
FP32_NMSE, FP32_ROW_NMSE, BF16_NMSE = 1e-6, 1e-5, 1e-3


def nmse(a, b, axis=None):
    return np.sum((a - b) ** 2, axis=axis) / np.sum(b**2, axis=axis)


def token_ids(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 1024, size=n)]


@functools.lru_cache(maxsize=None)
def reference(model_dir, n, seed, precision, absorbed=False):
    return ref.Reference(model_dir, precision=precision, mla_absorbed=absorbed).forward(token_ids(n, seed))


def engine_logits(k3_bin, model_dir, toks, tmp_path, precision, extra=()):
    out = tmp_path / "logits.npy"
    cmd = [k3_bin, "logits", "-m", str(model_dir), "--tokens", ",".join(map(str, toks)), "-o", str(out),
           "--precision", precision, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"`{' '.join(cmd[:2])} ... {' '.join(cmd[-2 - len(extra):])}` failed (rc {proc.returncode}):\n"
                    f"{proc.stderr[-3000:]}{proc.stdout[-1000:]}")
    logits = np.load(out)
    assert logits.dtype == np.float32, logits.dtype
    assert logits.shape == (len(toks), 1280), logits.shape
    assert np.all(np.isfinite(logits))
    return logits.astype(np.float64)


CASES = [   # (model, tokens, extra CLI args)
    *[(m, 20, ()) for m in MODELS],
    ("tiny-k31", 70, ()),                      # index_topk 8 exceeded many times
    ("tiny-kl", 150, ()),                      # > two 64-token KDA chunks plus a tail
    ("tiny-k3", 150, ()),
    *[(m, 24, ("--decode-path",)) for m in MODELS],
    ("tiny-k31", 70, ("--decode-path",)),
    *[(m, 70, ("--chunk", "16")) for m in MODELS],
    ("tiny-k3", 150, ("--chunk", "7")),
    *[(m, 40, ("--mla", mode)) for m in ("tiny-kl", "tiny-k31") for mode in ("absorbed", "unabsorbed")],
]


@pytest.mark.parametrize("model, n, extra", CASES, ids=[f"{m}-T{n}{''.join(e)}" for m, n, e in CASES])
def test_fp32_logits_match_reference(k3_bin, root, tmp_path, model, n, extra):
    model_dir = root / "models" / model
    toks = token_ids(n, seed=n)
    got = engine_logits(k3_bin, model_dir, toks, tmp_path, "fp32", extra)
    want = reference(str(model_dir), n, n, "fp32")
    err, rows = nmse(got, want), nmse(got, want, axis=1)
    print(f"{model} T={n} {' '.join(extra)} fp32 NMSE {err:.3e} (worst position {rows.max():.3e} "
          f"at {int(rows.argmax())})")
    assert err <= FP32_NMSE, f"NMSE {err:.3e} > {FP32_NMSE}"
    assert rows.max() <= FP32_ROW_NMSE, f"position {int(rows.argmax())}: NMSE {rows.max():.3e}"


# bf16: the engine and the reference round at the same points but accumulate in different orders (fp32 vs
# float64), so now and then one value lands on the other side of a bf16 rounding boundary (1 ulp). These tiny
# random models are chaotic: one such flip can change an MoE route or a DSA selection downstream, and the
# sequence's NMSE then jumps to 1e-4..1e-1 (observed over 12 random 12-token sequences: most bit-exact, 10-30%
# above 1e-3). A single sequence is therefore no verdict; the bound applies to the MEDIAN over several
# sequences, which a systematic rounding difference (affecting every sequence) still fails.
# The MLA form is named explicitly: kv_b_proj's output is a rounding point only in the unabsorbed form.
BF16_SEQS, BF16_T = 12, 12      # 12 tokens: past the K3.1 index_topk (8)
BF16_CASES = [
    *[(m, ("--mla", "unabsorbed")) for m in MODELS],
    ("tiny-k31", ("--mla", "absorbed")),
    *[(m, ("--decode-path", "--mla", "absorbed")) for m in ("tiny-k3", "tiny-k31")],
    ("tiny-kl", ("--chunk", "5", "--mla", "unabsorbed")),
]


@pytest.mark.parametrize("model, extra", BF16_CASES, ids=[f"{m}{''.join(e)}" for m, e in BF16_CASES])
def test_bf16_logits_match_bf16_reference(k3_bin, root, tmp_path, model, extra):
    model_dir = root / "models" / model
    errs = []
    for seed in range(BF16_SEQS):
        toks = token_ids(BF16_T, seed=1000 + seed)
        got = engine_logits(k3_bin, model_dir, toks, tmp_path, "bf16", extra)
        errs.append(nmse(got, reference(str(model_dir), BF16_T, 1000 + seed, "bf16", "absorbed" in extra)))
    median = float(np.median(errs))
    print(f"{model} {' '.join(extra)} bf16 NMSE per sequence: {' '.join(f'{e:.1e}' for e in errs)}; "
          f"median {median:.2e}")
    assert median <= BF16_NMSE, f"median bf16 NMSE {median:.3e} > {BF16_NMSE} (per sequence: {errs})"
