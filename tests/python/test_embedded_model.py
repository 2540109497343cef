"""The embedded models (models/k3-tiny, models/k3.1-tiny) in the engine agree with PyTorch, which trained them.

The expected numbers come from training/export_reference.py (PyTorch fp32 on the CPU, independent of the
engine) and are stored in tests/data/<model>-reference.json. A model whose reference file is absent (k3.1-tiny
before its device run is assembled) is skipped with a message.
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


def test_top1_agreement_with_pytorch(k3_bin, root, ref, tmp_path):
    ids = ref["first_window_ids"]
    out_npy = tmp_path / "logits.npy"
    r = subprocess.run([k3_bin, "logits", "-m", str(root / ref["model"]), "--tokens", ",".join(map(str, ids)),
                        "-o", str(out_npy), "--precision", "fp32"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    top1 = np.load(out_npy).argmax(-1)
    agree = float(np.mean(top1 == np.asarray(ref["first_window_top1"])))
    assert agree >= 0.99, f"top-1 agreement {agree:.3f}"


def test_model_card_records_pytorch_perplexity(root, ref):
    card = (root / ref["model"] / "README.md").read_text()
    assert re.search(r"^pytorch_heldout_ppl: \d+\.\d+$", card, re.M)


def test_run_continues_a_prompt(k3_bin, root, ref):
    r = subprocess.run([k3_bin, "run", "-m", str(root / ref["model"]), "-p", "It was a bright morning when",
                        "-n", "24", "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    words = re.findall(r"[A-Za-z]+", r.stdout)
    assert len(words) >= 10, r.stdout
