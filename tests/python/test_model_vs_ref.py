"""Engine logits vs the independent NumPy reference (tests/python/ref) on the tiny checkpoints.

CLI contract exercised (tools/k3/cmd_logits.cpp):
    k3 logits -m DIR --tokens 1,2,3,... -o OUT.npy --precision fp32|bf16 [--decode-path] [--chunk N]
              [--mla absorbed|unabsorbed]
    -> OUT.npy: float32 [T, vocab], the logits of every position of one sequence.
Bounds (NMSE = sum (engine - ref)^2 / sum ref^2):
    fp32: NMSE <= 1e-6 against the exact-math reference, and every position's own NMSE <= 1e-5
          (so an error confined to a few positions, e.g. one decode step, cannot hide in the average);
    bf16: NMSE <= 1e-3 against the bf16-rounding reference (the observed value is printed; run with -s).
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
def reference(model_dir, n, seed, precision):
    return ref.Reference(model_dir, precision=precision).forward(token_ids(n, seed))


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


BF16_CASES = [(m, 40, ()) for m in MODELS] + [("tiny-k31", 40, ("--decode-path",))]


@pytest.mark.parametrize("model, n, extra", BF16_CASES, ids=[f"{m}-T{n}{''.join(e)}" for m, n, e in BF16_CASES])
def test_bf16_logits_match_bf16_reference(k3_bin, root, tmp_path, model, n, extra):
    model_dir = root / "models" / model
    toks = token_ids(n, seed=n)
    got = engine_logits(k3_bin, model_dir, toks, tmp_path, "bf16", extra)
    want = reference(str(model_dir), n, n, "bf16")
    err = nmse(got, want)
    print(f"{model} T={n} {' '.join(extra)} bf16 NMSE {err:.3e} "
          f"(fp32 reference vs bf16 reference: {nmse(reference(str(model_dir), n, n, 'fp32'), want):.3e})")
    assert err <= BF16_NMSE, f"bf16 NMSE {err:.3e} > {BF16_NMSE}"
