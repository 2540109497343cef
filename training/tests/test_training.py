"""Checks of the PyTorch training model (needs torch; skipped without it). Run from the repo root:
    python3 -m pytest -q training/tests
- chunked KDA == the token recurrence (fp64)
- MXFP4 quantizer: dequantize(quantize(w)) is on the grid and re-quantizes to the same values
- export -> load round trip gives identical logits
- the exported tiny K3 and K3.1 checkpoints give the logits of the independent NumPy reference
  (tests/python/ref, fp32 mode) to 1e-3: every module, name, dtype and layout agrees with MODEL.md
- Quantile Balancing flattens a skewed expert load within a few updates
- one optimizer step of every parameter kind runs, and the loss falls over a few steps on a fixed batch
- staged K3.1 (k31_stages): only the MLA layers' self_attn changes; delta + assemble_k31.py = the trained K3.1
"""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "training"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import export  # noqa: E402
import k3_config  # noqa: E402
import kda  # noqa: E402
import load  # noqa: E402
import model  # noqa: E402
import moe  # noqa: E402
import optim  # noqa: E402


def _random_model(dsa: bool, seed: int = 0):
    torch.manual_seed(seed)
    m = model.K3Model(k3_config.tiny_args(dsa=dsa, index_topk=8))
    m.set_qat(True)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("_res.proj.weight"):
                p.normal_(0, 0.3)                   # non-uniform depth mixing
            p.copy_(p.bfloat16().float())           # what the checkpoint can hold
        for layer in m.moe_layers():
            layer.gate.e_score_correction_bias.normal_(0, 0.05)
    return m.eval()


def test_chunk_kda_matches_recurrence():
    torch.manual_seed(1)
    B, H, T, K, V = 2, 3, 45, 8, 10
    q = kda.l2norm(torch.randn(B, H, T, K, dtype=torch.float64)) * K ** -0.5
    k = kda.l2norm(torch.randn(B, H, T, K, dtype=torch.float64))
    v = torch.randn(B, H, T, V, dtype=torch.float64)
    g = -5 * torch.sigmoid(3 * torch.randn(B, H, T, K, dtype=torch.float64))
    beta = torch.sigmoid(torch.randn(B, H, T, dtype=torch.float64))
    ref = kda.naive_recurrent(q, k, v, g, beta)
    assert torch.allclose(kda.chunk_kda(q, k, v, g, beta, 16), ref, atol=1e-12)
    g_low = torch.full_like(g, -4.999)                  # the gate's lower bound over whole chunks
    out = kda.chunk_kda(q.float(), k.float(), v.float(), g_low.float(), beta.float(), 16)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), kda.naive_recurrent(q, k, v, g_low, beta), atol=1e-5)


def test_mxfp4_grid():
    torch.manual_seed(2)
    w = torch.randn(8, 96) * 0.05
    nib, scale = moe.mxfp4_quantize(w)
    assert nib.max() <= 15 and scale.max() < 255
    d = moe.mxfp4_dequantize(nib, scale)
    nib2, scale2 = moe.mxfp4_quantize(d)
    assert torch.equal(moe.mxfp4_dequantize(nib2, scale2), d)
    assert (d - w).abs().max() <= w.abs().max() / 4     # a block max maps into [4, 6] x scale


@pytest.mark.parametrize("dsa", [False, True])
def test_export_load_roundtrip(tmp_path, dsa):
    m = _random_model(dsa)
    export.export(m, str(tmp_path), shard_bytes=1 << 20)
    m2 = load.load(str(tmp_path)).eval()
    toks = torch.randint(0, 16128, (2, 33))
    with torch.no_grad():
        assert torch.equal(m(toks), m2(toks))


@pytest.mark.parametrize("dsa", [False, True])
def test_matches_numpy_reference(tmp_path, dsa):
    ref_model = pytest.importorskip("ref.model")
    m = _random_model(dsa, seed=3)
    export.export(m, str(tmp_path))
    toks = torch.randint(0, 16128, (1, 40))                # > index_topk: the DSA selection is exercised
    with torch.no_grad():
        mine = m(toks)[0].numpy()
    ref = ref_model.Reference(str(tmp_path), precision="fp32").forward(toks[0].tolist())
    assert np.abs(mine - ref).max() < 1e-3, np.abs(mine - ref).max()


def test_quantile_balancing_flattens_load():
    torch.manual_seed(4)
    a = k3_config.tiny_args(n_expert=16, n_expert_used=2)
    layer = moe.LatentMoE(a).train()
    skew = torch.randn(a.d_model)                          # a shared direction that favours a few experts
    imb = []
    for _ in range(12):
        x = torch.randn(4096, a.d_model) + skew
        with torch.no_grad():
            layer.route(x)
        imb.append(float(layer.load.max() / layer.load.mean()))
        layer.qb_update(damping=0.5)
    assert imb[0] > 3.0 and imb[-1] < 1.3, imb   # 4096 x 2 picks over 16 experts: sampling noise ~1.1


def test_training_steps_reduce_loss():
    torch.manual_seed(5)
    m = model.K3Model(k3_config.tiny_args(dsa=True, index_topk=8))
    opts = optim.make_optimizers(m, 3e-3)
    spec = optim.muon_blocks(m)
    assert any(v == "expert" for v in spec.values()) and any(isinstance(v, int) and v > 0 for v in spec.values())
    x = torch.randint(0, 16128, (2, 33))
    losses = []
    for _ in range(8):
        _, loss = m(x[:, :-1], x[:, 1:])
        (loss + 0.1 * m.aux_loss()).backward()
        for o in opts:
            o.step()
            o.zero_grad()
        for layer in m.moe_layers():
            layer.qb_update()
        losses.append(float(loss))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.5, losses


def test_k31_stages_delta_and_assembly(tmp_path):
    """Staged K3.1 from a K3: the stages change only the MLA layers' self_attn (indexers included) and leave
    the K3 untouched; the delta + assemble_k31.py rebuild a folder whose logits equal the trained K3.1's
    (30 tokens > index_topk 8: the selection is active)."""
    import argparse
    import assemble_k31
    import k31_stages
    import train
    k3 = _random_model(False, seed=3).train()
    before = {n: p.clone() for n, p in k3.named_parameters()}
    rng = np.random.default_rng(0)
    data = train.batches(rng.integers(0, 1000, 5000).astype(np.uint16), 2, 24, rng, torch.device("cpu"))
    args = argparse.Namespace(k31_indexer_minutes=10.0, k31_sparse_minutes=10.0, k31_indexer_lr=3e-3,
                              k31_sparse_lr=3e-3, max_steps=2)
    k31, stages = k31_stages.train_k31(k3, args, data, torch.device("cpu"), False, [])
    assert [s["steps"] for s in stages] == [2, 2]
    assert all(torch.equal(p, before[n]) for n, p in k3.named_parameters()), "K3 itself must not change"
    changed = {n for n, p in k31.named_parameters() if n not in before or not torch.equal(p, before[n])}
    assert changed and all(".self_attn." in n and k3.args.is_mla(int(n.split(".")[1])) for n in changed)
    k3_dir, out = tmp_path / "k3", tmp_path / "k31"
    export.export(k3, str(k3_dir))
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (k3_dir / name).write_text("x")
    info = k31_stages.export_delta(k3, k31, str(tmp_path / "delta.safetensors"))
    assert info["tensors"] == len(k31_stages.delta_names(export.canonical_tensors(k31), k31.args))
    assemble_k31.main(["--k3", str(k3_dir), "--delta", str(tmp_path / "delta.safetensors"), "--out", str(out)])
    toks = torch.randint(0, 1000, (1, 30))
    with torch.no_grad():
        want = k31.eval()(toks)
        got = load.load(str(out)).eval()(toks)
    assert torch.equal(want, got)


def test_router_ties_go_to_the_lower_expert():
    # an exact fp32 tie at the k-th place: MODEL.md (and the engine) pick the lower expert id
    s = torch.tensor([[0.9, 0.5, 0.7, 0.5, 0.1], [0.5, 0.5, 0.5, 0.5, 0.5]])
    assert moe.top_k_lower(s, 3).sort(-1).values.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_index_set_tie_aware_comparison():
    import acceptance
    T, k = 6, 3
    scores = torch.tensor([[1.0, 0.8, 0.5, 0.5 + 2e-6, 0.1, 0.0]]).expand(T, T).tril()
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    from mla import Indexer
    keep = Indexer.select(type("I", (), {"topk": k})(), scores[None])[0]
    ref = torch.stack([keep[t].nonzero()[:, 0] for t in range(k, T)])           # reference sets, rows >= k
    eng = -np.ones((T, k), dtype=np.int64)
    for t in range(k):
        eng[t, :t + 1] = np.arange(t + 1)    # a query that sees at most k positions reads 0..t (dsa.cpp)
    eng[k:] = ref.numpy()
    strict, tie, _ = acceptance.compare_rows(keep, scores, eng, k)
    assert strict.all() and tie.all()
    eng[5] = [0, 1, 2]                       # 2 instead of 3: 2e-6 apart, a near-tie (eps 1e-5) -> tie-equal
    strict, tie, gap = acceptance.compare_rows(keep, scores, eng, k)
    assert not strict[5] and tie[5] and gap[5] < 1e-5
    eng[5] = [0, 1, 4]                       # 4 instead of 3: 0.4 apart -> differs in both counts
    strict, tie, _ = acceptance.compare_rows(keep, scores, eng, k)
    assert not strict[5] and not tie[5] and strict[:5].all()
