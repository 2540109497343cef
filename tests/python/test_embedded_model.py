"""The embedded default model (models/k3-tiny) in the engine agrees with PyTorch, which trained it.

The expected numbers come from training/export_reference.py (PyTorch fp32 on the CPU, independent of the
engine) and are stored in tests/data/k3-tiny-reference.json.
"""
import json
import re
import subprocess

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ref(root):
    return json.loads((root / "tests/data/k3-tiny-reference.json").read_text())


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


def test_model_card_records_pytorch_perplexity(root):
    card = (root / "models/k3-tiny/README.md").read_text()
    assert re.search(r"^pytorch_heldout_ppl: \d+\.\d+$", card, re.M)


def test_run_continues_a_prompt(k3_bin, root):
    r = subprocess.run([k3_bin, "run", "-m", str(root / "models/k3-tiny"), "-p", "It was a bright morning when",
                        "-n", "24", "--temp", "0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    words = re.findall(r"[A-Za-z]+", r.stdout)
    assert len(words) >= 10, r.stdout
