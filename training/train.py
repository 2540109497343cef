#!/usr/bin/env python3
"""train.py: trains the small K3 (or K3.1 with --dsa) model for a fixed wall-clock budget and exports it.

Data: DATA/train.npy, DATA/val.npy (uint16 token streams from tokenize_corpus.py) + DATA/meta.json.
Step: random windows [B, T+1] of the train stream; loss = CE(next token) (+ 0.1 * indexer KL for --dsa);
bf16 autocast on CUDA (KDA recurrence, softmaxes, router and norms in fp32); grad clip 1.0;
per-head Muon for matrices + AdamW for the rest (optim.py), one lr; after each step the Quantile
Balancing bias update of every MoE layer.
Schedule over the budget fraction f = elapsed / budget: linear warmup (first `warmup` steps), constant,
then linear decay from f = 0.6 to lr * 0.1 at f = 1 (warmup-stable-decay). MXFP4 QAT for f >= 1 - qat_frac.
Early decay: when the quick held-out perplexity (16 windows, every `eval_every` steps) is more than 1% above
its best twice in a row (overfitting the ~5.5 M-token corpus), the budget shrinks so that f = 0.75 now:
the run enters its decay and QAT phases at once and ends early.
End: weights rounded to bf16 (what the checkpoint stores), held-out perplexity over the first `eval_windows`
non-overlapping T-token windows of val.npy (predicting tokens 1..T of each window from its own prefix),
samples, export to OUT/model (export.py), OUT/summary.json.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k31_stages  # noqa: E402
from export import export  # noqa: E402
from k3_config import ModelArgs, tiny_args  # noqa: E402
from model import K3Model  # noqa: E402
from optim import make_optimizers  # noqa: E402


def batches(tokens: np.ndarray, B: int, T: int, rng: np.random.Generator, device):
    while True:
        starts = rng.integers(0, len(tokens) - T - 1, size=B)
        x = np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64)
        t = torch.from_numpy(x).to(device, non_blocking=True)
        yield t[:, :-1], t[:, 1:]


def probe_batch(model, fwd, B, T, vocab, device, amp):
    """One forward/backward at batch B; on CUDA out-of-memory halve B and retry. Returns the batch that fits."""
    while True:
        try:
            x = torch.randint(0, vocab, (B, T + 1), device=device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                _, loss = fwd(x[:, :-1], x[:, 1:])
            loss.backward()
            model.zero_grad(set_to_none=True)
            for m in model.moe_layers():
                m.qb_hist.zero_()
                m.qb_observed = False
            if device.type == "cuda":
                print(f"batch {B} x {T}: peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
            return B
        except torch.cuda.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if B == 1:
                raise
            B //= 2
            print(f"out of memory: retrying with batch {B}", flush=True)


def lr_at(step, frac, base, warmup):
    w = min(1.0, (step + 1) / warmup)
    d = 1.0 if frac < 0.6 else 1.0 - 0.9 * min(1.0, (frac - 0.6) / 0.4)
    return base * w * d


@torch.no_grad()
def evaluate(model, val: np.ndarray, T: int, windows: int, B: int, device, amp):
    model.eval()
    n = min(windows, (len(val) - 1) // T)
    nll, count = 0.0, 0
    for i in range(0, n, B):
        rows = [val[j * T:(j + 1) * T + 1].astype(np.int64) for j in range(i, min(n, i + B))]
        x = torch.from_numpy(np.stack(rows)).to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x[:, :-1])
        lp = torch.log_softmax(logits.float(), -1).gather(-1, x[:, 1:, None])
        nll -= float(lp.sum())
        count += lp.numel()
    model.train()
    return {"windows": n, "window_tokens": T, "tokens": count, "nll": nll / max(count, 1),
            "ppl": math.exp(nll / max(count, 1))}


@torch.no_grad()
def evaluate_text(model, ids: np.ndarray, ctx: int, B: int, device, amp, max_windows: int = 0):
    """The `k3 perplexity -c ctx` definition (tools/k3/cmd_perplexity.cpp, stride = ctx): windows
    [b, min(b + ctx, N)) with b = k ctx until b + ctx >= N, each from a fresh state; every id after the
    window's first is scored: perplexity = exp(mean -log softmax(z_{j-1})[id_j])."""
    model.eval()
    N, starts, b = len(ids), [], 0
    while True:
        starts.append(b)
        if b + ctx >= N or (max_windows and len(starts) >= max_windows):
            break
        b += ctx
    nll, count = 0.0, 0
    full = [s for s in starts if s + ctx <= N]
    groups = [full[i:i + B] for i in range(0, len(full), B)] + [[s] for s in starts if s + ctx > N]
    for group in groups:
        rows = np.stack([ids[s:min(s + ctx, N)].astype(np.int64) for s in group])
        x = torch.from_numpy(rows).to(device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x[:, :-1])
        lp = torch.log_softmax(logits.float(), -1).gather(-1, x[:, 1:, None])
        nll -= float(lp.double().sum())
        count += lp.numel()
    model.train()
    cmd = f"k3 perplexity -m MODEL_DIR -f .carry/data/val_eval.txt -c {ctx}"
    return {"windows": len(starts), "ctx": ctx, "tokens_scored": count, "ppl": math.exp(nll / max(count, 1)),
            "engine_command": cmd + (f" --max-windows {max_windows}" if max_windows else "")}


@torch.no_grad()
def sample(model, prompt_ids, n_new, device, stop_id, temperature=0.8, top_k=40, seed=0):
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt_ids)
    for _ in range(n_new):
        logits = model(torch.tensor([ids], device=device))[0, -1].float().cpu()
        v, ix = logits.topk(top_k)
        nxt = int(ix[torch.multinomial(torch.softmax(v / temperature, -1), 1, generator=g)])
        ids.append(nxt)
        if nxt == stop_id:
            break
    model.train()
    return ids[len(prompt_ids):]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=".carry/data")
    ap.add_argument("--tokenizer", default=".carry/tokenizer")
    ap.add_argument("--out", default="/tmp/k3-train-out")
    ap.add_argument("--minutes", type=float, default=10.0, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps (smoke tests)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--qb-damping", type=float, default=0.5)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--sample-tokens", type=int, default=60)
    ap.add_argument("--no-early-decay", dest="early_decay", action="store_false",
                    help="keep the schedule even when the quick held-out check worsens twice in a row")
    ap.add_argument("--eval-text-windows", type=int, default=0, help="limit val_eval.txt windows (0 = all)")
    ap.add_argument("--dsa", action="store_true", help="K3.1 from scratch (indexer KL from step 0; superseded by --k31)")
    ap.add_argument("--k31", action="store_true", help="after K3: staged K3.1 (k31_stages.py) -> OUT/k31-delta.safetensors")
    ap.add_argument("--k31-indexer-minutes", type=float, default=0.75, help="stage 1: indexer KL, trunk frozen")
    ap.add_argument("--k31-sparse-minutes", type=float, default=1.0, help="stage 2: sparse fine-tune of MLA/DSA attention")
    ap.add_argument("--k31-indexer-lr", type=float, default=3e-3)
    ap.add_argument("--k31-sparse-lr", type=float, default=3e-4)
    ap.add_argument("--tiny", action="store_true", help="toy widths for CPU smoke tests")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250, help="quick held-out check (16 windows); 0 = off")
    ap.add_argument("--shard-mib", type=float, default=15.0, help="export shard size (device hand-back: 16 MiB/file)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    meta = json.load(open(os.path.join(args.data, "meta.json")))
    train = np.load(os.path.join(args.data, "train.npy"), mmap_mode="r")
    val = np.load(os.path.join(args.data, "val.npy"), mmap_mode="r")
    kw = dict(vocab_size=meta["n_vocab"], n_base=meta["n_base"], dsa=args.dsa)
    margs = tiny_args(**kw) if args.tiny else ModelArgs(**kw)
    model = K3Model(margs).to(device)
    counts = model.param_counts()
    print(f"params: {json.dumps(counts)}  device {device}  train tokens {len(train)}  val tokens {len(val)}", flush=True)
    fwd = torch.compile(model) if args.compile else model
    opts = make_optimizers(model, args.lr)
    rng = np.random.default_rng(args.seed)
    args.batch = probe_batch(model, fwd, args.batch, args.seq, margs.vocab_size, device, amp)
    data = batches(train, args.batch, args.seq, rng, device)
    budget = args.minutes * 60.0
    t0, step, seen, qat, log = time.time(), 0, 0, False, []
    best_val, worse = float("inf"), 0
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
            break
        if not qat and frac >= 1.0 - args.qat_frac:
            model.set_qat(True)
            qat = True
            print(f"step {step}: MXFP4 QAT on", flush=True)
        lr = lr_at(step, frac, args.lr, args.warmup)
        for o in opts:
            for g in o.param_groups:
                g["lr"] = lr
        x, y = next(data)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            _, loss = fwd(x, y)
            aux = model.aux_loss()
            total = loss + 0.1 * aux if aux is not None else loss
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        for m in model.moe_layers():
            m.qb_update(args.qb_damping)
        step += 1
        seen += x.numel()
        if args.eval_every and step % args.eval_every == 0:
            quick = evaluate(model, val, args.seq, 16, args.batch, device, amp)
            el = time.time() - t0
            log.append({"step": step, "val_ppl_16w": round(quick["ppl"], 3), "elapsed_s": round(el, 1)})
            print(json.dumps(log[-1]), flush=True)
            worse = worse + 1 if quick["ppl"] > best_val * 1.01 else 0
            best_val = min(best_val, quick["ppl"])
            if worse >= 2 and el / budget < 0.75 and args.early_decay:
                budget = el / 0.75                  # overfitting: jump to the decay phase (and QAT) now
                log.append({"step": step, "early_decay": True, "new_budget_s": round(budget, 1)})
                print(json.dumps(log[-1]), flush=True)
        if step % args.log_every == 0 or step == 1:
            loads = torch.stack([m.load for m in model.moe_layers()])
            imb = float((loads.max(-1).values / loads.mean(-1)).mean())
            el = time.time() - t0
            rec = {"step": step, "loss": round(float(loss), 4), "aux": round(float(aux), 4) if aux is not None else None,
                   "lr": lr, "gnorm": round(float(gnorm), 3), "tok_s": int(seen / el), "max_load/mean": round(imb, 3),
                   "elapsed_s": round(el, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_s = time.time() - t0
    with torch.no_grad():                                     # what the checkpoint stores
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    model.set_qat(True)
    ev = evaluate(model, val, args.seq, args.eval_windows, args.batch, device, amp)
    print(f"held-out: {json.dumps(ev)}", flush=True)
    ev_text = None
    if os.path.exists(os.path.join(args.data, "val_eval.npy")):
        ev_text = evaluate_text(model, np.load(os.path.join(args.data, "val_eval.npy")), args.seq, args.batch,
                                device, amp, args.eval_text_windows)
        print(f"held-out text (engine definition): {json.dumps(ev_text)}", flush=True)
    samples = {}
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from tokenize_corpus import encode_chat, load_tokenizer
        enc, specials, n_base = load_tokenizer(args.tokenizer)
        inv = {v: k for k, v in specials.items()}
        dec = lambda ids: "".join(inv[i] if i >= n_base else enc.decode([i]) for i in ids)
        prompts = {"prose": [specials["[BOS]"]] + enc.encode_ordinary("It was a bright morning when"),
                   "chat": encode_chat(enc, specials, '<|open|>message role="user"<|sep|>Who wrote Emma?'
                                       '<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"'
                                       '<|sep|><|open|>think<|sep|>')}
        for name, ids in prompts.items():
            samples[name] = dec(ids) + " ||| " + dec(sample(model, ids, args.sample_tokens, device, margs.stop_id))
            print(f"sample[{name}]: {samples[name]!r}", flush=True)
    except Exception as e:                                    # samples are a courtesy; never lose the run
        print(f"sampling skipped: {e!r}", flush=True)
    info = export(model, os.path.join(args.out, "model"), None, shard_bytes=int(args.shard_mib * 2**20))
    summary = {"params": counts, "steps": step, "tokens_seen": seen, "train_seconds": round(train_s, 1),
               "epochs": round(seen / len(train), 2),
               "final_train_loss": next((r["loss"] for r in reversed(log) if "loss" in r), None),
               "held_out": ev, "held_out_text": ev_text, "export": info, "samples": samples, "args": vars(args),
               "qb_bias_std": [float(m.gate.e_score_correction_bias.std()) for m in model.moe_layers()],
               "log": log}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if args.k31:                                      # K3 is saved already: a K3.1 failure cannot lose it
        summary["k31"] = k31_phase(model, args, data, device, amp, val, log)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    print(f"SUMMARY steps={step} tokens={seen} train_s={train_s:.0f} held_out_ppl={ev['ppl']:.3f} "
          f"val_eval_txt_ppl={ev_text['ppl'] if ev_text else float('nan'):.3f} "
          f"export={info['bytes'] / 2**20:.1f} MiB in {len(info['shards'])} shards", flush=True)



def k31_phase(k3, args, data, device, amp, val, log):
    """Staged K3.1 from the trained K3 (k31_stages.py); held-out sparse and dense; delta to OUT/k31-delta.safetensors."""
    k31, stages = k31_stages.train_k31(k3, args, data, device, amp, log)
    res = {"stages": stages, "held_out": evaluate(k31, val, args.seq, args.eval_windows, args.batch, device, amp)}
    path = os.path.join(args.data, "val_eval.npy")
    if os.path.exists(path):
        ids = np.load(path)
        for mode in ("sparse", "dense"):
            k31_stages.set_dense(k31, mode == "dense")
            res[f"held_out_text_{mode}"] = evaluate_text(k31, ids, args.seq, args.batch, device, amp,
                                                         args.eval_text_windows)
        k31_stages.set_dense(k31, False)
    res["export"] = k31_stages.export_delta(k3, k31, os.path.join(args.out, "k31-delta.safetensors"))
    print(f"K3.1: {json.dumps({k: v for k, v in res.items() if k != 'stages'})}", flush=True)
    return res


if __name__ == "__main__":
    main()
