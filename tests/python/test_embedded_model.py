"""The embedded models (models/k3-tiny, models/k3.1-tiny) in the engine agree with PyTorch, which trained them.

The expected numbers come from training/export_reference.py (PyTorch fp32 on the CPU, independent of the
engine) and are stored in tests/data/<model>-reference.json. A model whose reference file is absent (k3.1-tiny
before its device run is assembled) is skipped with a message. For K3.1 the reference also holds PyTorch's DSA
selected sets over the first window, compared row by row with the engine's (`k3 logits --dump dsa_sel`).
"""
import json
import re
import subprocess

import numpy as np
import pytest

MODELS = ["k3-tiny", "k3.1-tiny"]


@pytest.fixture(scope="module", params=MODELS)
def ref(request, root):
    path = root / f"tests/data/{request.param}-reference.json"
    if not path.exists() or not (root / f"models/{request.param}/config.json").exists():
        pytest.skip(f"{request.param}: no reference ({path.name}) or model folder yet (docs/training.md)")
    return json.loads(path.read_text())


def test_perplexity_equals_pytorch(k3_bin, root, ref):
    out = subprocess.run([k3_bin, "perplexity", "-m", str(root / ref["model"]), "-f", str(root / ref["text"]),
                          "-c", str(ref["ctx"]), "--max-windows", str(ref["windows"]), "--precision", "fp32"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    ppl = float(out.stdout.strip().splitlines()[-1].split(":")[1])
    rel = abs(ppl - ref["pytorch_ppl"]) / ref["pytorch_ppl"]
    assert rel <= 5e-3, f"engine {ppl} vs pytorch {ref['pytorch_ppl']} (rel {rel:.2e})"


@pytest.fixture(scope="module")
def first_window(k3_bin, root, ref, tmp_path_factory):
    """The engine over the reference's first window: logits [T, V] and the traced dsa_sel files."""
    d = tmp_path_factory.mktemp("first_window")
    r = subprocess.run([k3_bin, "logits", "-m", str(root / ref["model"]), "--tokens",
                        ",".join(map(str, ref["first_window_ids"])), "-o", str(d / "logits.npy"), "--precision",
                        "fp32", "--trace-out", str(d / "trace"), "--dump", "dsa_sel"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    files = sorted((d / "trace").glob("dsa_sel-L*.npy"), key=lambda f: int(f.stem.split("-L")[1]))
    return np.load(d / "logits.npy"), [np.load(f) for f in files]


def test_top1_agreement_with_pytorch(ref, first_window):
    top1 = first_window[0].argmax(-1)
    agree = float(np.mean(top1 == np.asarray(ref["first_window_top1"])))
    assert agree >= 0.99, f"top-1 agreement {agree:.3f}"


def test_dsa_index_sets_equal_pytorch(ref, first_window):
    if "first_window_dsa_sel" not in ref:
        pytest.skip(f"{ref['model']}: no DSA layers")
    want, got = ref["first_window_dsa_sel"], first_window[1]
    assert len(got) == len(want), f"engine traced {len(got)} DSA layers, PyTorch {len(want)}"
    for layer, (w_rows, g) in enumerate(zip(want, got)):
        assert g.shape[0] == len(w_rows), (g.shape, len(w_rows))
        g_rows = [hex(sum(1 << int(s) for s in row if s >= 0)) for row in g]
        bad = [t for t, (a, b) in enumerate(zip(w_rows, g_rows)) if a != b]
        assert not bad, f"DSA layer {layer}: rows {bad[:10]} select other positions than PyTorch"
    assert len(want[0]) > g.shape[1], "the window must be longer than index_topk for the indexer to select"


def test_model_card_records_pytorch_perplexity(root, ref):
    card = (root / ref["model"] / "README.md").read_text()
    assert re.search(r"^pytorch_heldout_ppl: \d+\.\d+$", card, re.M)


def test_run_continues_a_prompt(k3_bin, root, ref):
    r = subprocess.run([k3_bin, "run", "-m", str(root / ref["model"]), "-p", "It was a bright morning when",
                        "-n", "24", "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    words = re.findall(r"[A-Za-z]+", r.stdout)
    assert len(words) >= 10, r.stdout
