"""k31_stages.py: K3.1 from a trained K3 trunk in two stages (issue 4; the recipe of DeepSeek-V3.2).

  K3 (trained)  --copy every tensor-->  K3.1 = K3 + Gated DSA indexers on the MLA layers (fresh init)
  stage 1, indexer warm-up: trunk frozen, main attention DENSE (MLA.dense), loss = mean over the MLA layers
           of KL(head-mean dense attention || softmax of the index scores); only the indexers train.
  stage 2, sparse fine-tune: main attention restricted to the index_topk selected keys; trainable = every
           tensor of the MLA/DSA layers' self_attn (indexer included), all else frozen (KDA layers, MLPs,
           experts, router and its bias, AttnRes queries, norms, embedding, head);
           loss = CE + 0.1 KL (the indexer keeps following the dense distribution; its inputs are detached).
Because only those tensors change, the K3.1 checkpoint = the K3 checkpoint with the self_attn tensors of the
MLA layers replaced (and the indexer added): `export_delta` writes just them (2 MB, one file, the K3.1
config.json in its __metadata__) and training/assemble_k31.py rebuilds the full folder from the K3 one. `check_delta` proves the rest is unchanged.
Schedule per stage: warmup 20 steps, constant, linear decay to 10% over the last 40% of the stage's budget.
No Quantile Balancing update (the router bias is frozen with the trunk).
"""
import dataclasses
import json
import os
import time

import torch

from export import canonical_tensors, published_name, write_safetensors
from k3_config import to_hf_config
from mla import MLA
from model import K3Model
from optim import make_optimizers


def from_k3(k3: K3Model) -> K3Model:
    """A K3.1 model holding every tensor of k3 (same device), plus freshly initialised indexers."""
    a = dataclasses.replace(k3.args, dsa=True)
    m = K3Model(a).to(next(k3.parameters()).device)
    res = m.load_state_dict(k3.state_dict(), strict=False)
    assert not res.unexpected_keys and all(".indexer." in k for k in res.missing_keys), res
    m.set_qat(True)                                   # the experts stay on their exported MXFP4 grid
    return m


def mla_modules(model):
    return [m for m in model.modules() if isinstance(m, MLA)]


def set_dense(model, dense: bool):
    for m in mla_modules(model):
        m.dense = dense


def delta_names(names, a):
    """Canonical names the stages change: model.layers.{i}.self_attn.* for every MLA layer i."""
    prefixes = tuple(f"model.layers.{i}.self_attn." for i in range(a.n_layer) if a.is_mla(i))
    return sorted(n for n in names if n.startswith(prefixes))


def run_stage(model, name, trainable, minutes, lr, data, device, amp, ce_weight, log, max_steps=0, log_every=25):
    """Trains `trainable` (all else frozen) for `minutes`; loss = ce_weight CE + KL (ce_weight 0: KL only)."""
    import train as T                                 # lr_at (no import cycle at module load)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    opts = make_optimizers(model, lr)                 # frozen tensors get no gradient: the optimizers skip them
    budget, t0, step, seen, rows = minutes * 60.0, time.time(), 0, 0, None
    ce = kl = None
    n_train = sum(p.numel() for p in trainable)
    print(f"== K3.1 {name}: {n_train:,} trainable parameters, {minutes} min, lr {lr}", flush=True)
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0 or (max_steps and step >= max_steps):
            break
        cur = T.lr_at(step, frac, lr, 20)
        for o in opts:
            for g in o.param_groups:
                g["lr"] = cur
        x, y = next(data)
        x, y = x[:rows], y[:rows]
        try:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                _, ce = model(x, y)
                kl = model.aux_loss()
                total = ce_weight * ce + (0.1 if ce_weight else 1.0) * kl
            total.backward()
        except torch.cuda.OutOfMemoryError:           # the DSA scores [B, T, T] per layer: fewer rows
            if x.shape[0] == 1:
                raise
            model.zero_grad(set_to_none=True)
            ce = kl = total = None
            torch.cuda.empty_cache()
            rows = x.shape[0] // 2
            print(f"out of memory: {name} continues with {rows} rows per step", flush=True)
            continue
        gnorm = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        step += 1
        seen += x.numel()
        if step % log_every == 0 or step == 1:
            el = time.time() - t0
            rec = {"stage": name, "step": step, "loss": round(float(ce), 4), "kl": round(float(kl), 4), "lr": cur,
                   "gnorm": round(float(gnorm), 3), "tok_s": int(seen / el), "elapsed_s": round(el, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    for p in model.parameters():
        p.requires_grad_(True)
    return {"stage": name, "steps": step, "tokens_seen": seen, "seconds": round(time.time() - t0, 1),
            "trainable_params": n_train,
            "final_loss": None if ce is None else float(ce), "final_kl": None if kl is None else float(kl)}


def train_k31(k3, args, data, device, amp, log):
    """The two stages on a copy of k3; returns (k31 model, list of stage summaries)."""
    m = from_k3(k3)
    indexers = [p for mod in mla_modules(m) for p in mod.indexer.parameters()]
    attn = [p for mod in mla_modules(m) for p in mod.parameters()]       # self_attn of the MLA layers, indexer incl.
    set_dense(m, True)
    s1 = run_stage(m, "indexer_kl", indexers, args.k31_indexer_minutes, args.k31_indexer_lr, data, device, amp,
                   0.0, log, args.max_steps, log_every=10)
    set_dense(m, False)
    s2 = run_stage(m, "sparse_finetune", attn, args.k31_sparse_minutes, args.k31_sparse_lr, data, device, amp,
                   1.0, log, args.max_steps, log_every=10)
    with torch.no_grad():                             # what the checkpoint stores
        for p in m.parameters():
            p.copy_(p.bfloat16().float())
    return m, [s1, s2]


def check_delta(k3, k31):
    """Every tensor outside the delta is bit-identical to K3's (the trunk really was frozen). -> delta names."""
    t3, t31 = canonical_tensors(k3), canonical_tensors(k31)
    names = delta_names(t31, k31.args)
    for n, t in t31.items():
        if n not in names:
            assert torch.equal(t, t3[n]), f"K3.1 changed {n}, which is not in the delta"
    return names


def export_delta(k3, k31, path):
    """One safetensors file: the delta tensors (published names) + __metadata__["config.json"] = the K3.1
    config (one file, so the device hand-back keeps a slot free for a log)."""
    names = check_delta(k3.cpu(), k31.cpu())
    t = canonical_tensors(k31)
    nbytes = write_safetensors(path, {published_name(n): t[n] for n in names},
                               {"config.json": json.dumps(to_hf_config(k31.args))})
    return {"tensors": len(names), "bytes": nbytes, "file": os.path.basename(path)}
