#!/usr/bin/env python3
"""model_card.py: README.md (model card) of a shipped tiny model from its training summary and acceptance JSON.

    python3 training/model_card.py --model models/k3-tiny   --summary SUMMARY.json --acceptance ACC.json
    python3 training/model_card.py --model models/k3.1-tiny --summary SUMMARY.json --acceptance ACC.json --k31

SUMMARY is the device run's summary.json (K3 and, under "k31", the K3.1 stages); ACC is what
training/acceptance.py wrote for this model (PyTorch fp32 perplexity on models/heldout.txt, engine numbers).
The card has the architecture (from config.json), data, training steps, final train / held-out loss, licence
and the line `pytorch_heldout_ppl: <value>` (PyTorch's perplexity on models/heldout.txt, `k3 perplexity -c 1024`
windowing), which tests read.
"""
import argparse
import json
import math
import os


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--acceptance", required=True)
    ap.add_argument("--k31", action="store_true")
    ap.add_argument("--router-load", help="training/router_load.py JSON over the whole held-out text (engine)")
    a = ap.parse_args(argv)
    s, acc = json.load(open(a.summary)), json.load(open(a.acceptance))
    t = json.load(open(os.path.join(a.model, "config.json")))["text_config"]
    la, name = t["linear_attn_config"], os.path.basename(os.path.normpath(a.model))
    p = s["params"]
    lines = [
        f"# {name}", "",
        f"A small {'Kimi K3.1' if a.k31 else 'Kimi K3'}-architecture language model trained by the k3.cpp project "
        "(training/, docs/training.md) as the engine's embedded default and end-to-end check. Toy quality: "
        "it writes plausible English prose and the K3 chat format, not facts.", "",
        "## Architecture", "",
        f"- d_model {t['hidden_size']}, {t['num_hidden_layers']} layers, vocab {t['vocab_size']} "
        f"(16,128 BPE ranks + 256 K3 specials), untied embedding and head",
        f"- KDA layers {la['kda_layers']}: {la['num_heads']} heads x {la['head_dim']}, gate lower bound "
        f"{la['gate_lower_bound']}, full-rank output gate",
        f"- Gated MLA (NoPE) layers {la['full_attn_layers']}: {t['num_attention_heads']} heads, q_lora "
        f"{t['q_lora_rank']}, kv_lora {t['kv_lora_rank']}, nope/rope/v {t['qk_nope_head_dim']}/"
        f"{t['qk_rope_head_dim']}/{t['v_head_dim']}",
        f"- layer 1 dense SiTU-GLU (d_ff {t['intermediate_size']}); layers 2-{t['num_hidden_layers']} Stable LatentMoE: "
        f"{t['num_experts']} MXFP4 experts (d_ff {t['moe_intermediate_size']}), {t['num_experts_per_token']} "
        f"used, {t['num_shared_experts']} shared, latent {t['routed_expert_hidden_size']}, sigmoid router",
        f"- Block AttnRes, blocks of {t['attn_res_block_size']} layers",
    ]
    if a.k31:
        d = t["dsa_config"]
        lines.append(f"- Gated DSA indexers on layers {d['dsa_layers']}: {d['index_num_heads']} heads x "
                     f"{d['index_head_dim']}, index_topk {d['index_topk']}")
    lines += [f"- parameters (K3 trunk): {p['total']:,} total, {p['active']:,} active per token", "",
              "## Data", "",
              "Public-domain and permissively licensed prose from Debian packages (Austen, Moby Dick, World "
              "English Bible, KJV, Python documentation) plus synthetic XTML conversations; 5.54 M training "
              "tokens, held-out split by document (data/SOURCES.md, docs/training.md).", "",
              "## Training", ""]
    ev = s["held_out"]
    lines += [f"- K3: {s['steps']} steps, {s['tokens_seen']:,} tokens ({s['epochs']} epochs), "
              f"{s['train_seconds']} s on one H200; final train loss {s['final_train_loss']}, held-out loss "
              f"{ev['nll']:.4f} (ppl {ev['ppl']:.3f}, {ev['windows']} windows of {ev['window_tokens']})"]
    if a.k31:
        k = s["k31"]
        for st in k["stages"]:
            lines.append(f"- K3.1 {st['stage']}: {st['steps']} steps, {st['tokens_seen']:,} tokens, "
                         f"{st['trainable_params']:,} trainable parameters; final loss {st['final_loss']:.4f}, "
                         f"indexer KL {st['final_kl']:.4f}")
        lines.append(f"- K3.1 held-out loss {k['held_out']['nll']:.4f} (ppl {k['held_out']['ppl']:.3f})")
    cal_path = os.path.join(a.model, "calibration.json")
    cal = json.load(open(cal_path)) if os.path.exists(cal_path) else None
    if cal:
        ly = cal["layers"]
        lines.append(
            f"- last stage, router calibration (CPU, every weight frozen; `training/calibrate_router.py`, "
            f"calibration.json): Quantile Balancing of the {len(ly)} router biases on {cal['windows']} random "
            f"windows of {cal['ctx']} tokens of the TRAINING data (seed {cal['seed']}), {cal['iters']} QB updates "
            f"per layer, layer by layer; expert load on those tokens min/max x mean "
            f"{min(l['before_min'] for l in ly):.2f}/{max(l['before_max'] for l in ly):.2f} before, "
            f"{min(l['after_min'] for l in ly):.2f}/{max(l['after_max'] for l in ly):.2f} after; only the "
            f"e_score_correction_bias tensors changed"
            + (" (K3.1: rebuilt from the calibrated K3 with its unchanged DSA-layer delta, assemble_k31.py)"
               if a.k31 else ""))
    pw = acc.get("router_load_pytorch_windows", acc)          # acceptance --router-load-json moves them there
    lines += ["", "## Held-out evaluation (CPU, fp32)", "",
              f"pytorch_heldout_ppl: {acc['pytorch_ppl']:.6f}", "",
              f"- models/heldout.txt, {acc['windows']} windows of {acc['ctx']} ({acc['scored']:,} scored tokens); "
              f"engine: `{acc['engine_command']}` -> {acc['engine_ppl']:.6f} (relative difference "
              f"{acc['ppl_rel_diff']:.1e}); top-1 agreement {acc['top1_agreement'] * 100:.2f}% over "
              f"{acc['top1_positions']} positions",
              f"- router load over those windows (PyTorch): min {pw['router_load_min']:.2f}, max "
              f"{pw['router_load_max']:.2f} x the mean (check: every expert of every MoE layer within [0.25, 4] "
              f"x the mean{'; the check is taken over the whole text, next line' if a.router_load else ''})"]
    if a.router_load:
        rl = json.load(open(a.router_load))
        lines.append(f"- router load over the whole text ({rl['source'].split(': ', 1)[1]}, {rl['tokens_routed']:,} "
                     f"tokens, the engine's router inputs, `training/router_load.py`): min "
                     f"{rl['router_load_min']:.2f}, max {rl['router_load_max']:.2f} x the mean: "
                     f"{'pass' if rl['pass'] else 'FAIL'}")
    ht = s.get("held_out_text")
    if ht:
        if a.k31 and "held_out_text_sparse" in s.get("k31", {}):
            k = s["k31"]
            val = (f"{k['held_out_text_sparse']['ppl']:.3f} (main attention dense: "
                   f"{k['held_out_text_dense']['ppl']:.3f})")
        else:
            val = f"{ht['ppl']:.3f}"
        lines.append(f"- the whole text ({ht['windows']} windows of {ht['ctx']}, {ht['tokens_scored']:,} tokens) in "
                     f"the training run on the H200 (PyTorch, bf16 autocast{', before the router calibration' if cal else ''}"
                     f"): ppl {val}")
    if a.k31:
        lines.append(f"- dense-attention perplexity {acc['pytorch_ppl_dense']:.4f}: DSA "
                     f"{acc['dsa_vs_dense'] * 100:+.2f}%")
        ix = acc.get("index_sets")
        if isinstance(ix, dict) and "same_inputs" in ix:
            si, ee = ix["same_inputs"], ix["end_to_end"]
            lines.append(f"- DSA selected index sets, engine vs PyTorch ({ix['windows']} windows x {ix['dsa_layers']} "
                         f"DSA layers, {si['rows']:,} query rows, {si['rows_selecting']:,} past index_topk where the "
                         f"indexer selects): given the same indexer inputs {si['rows_equal']:,} rows identical, "
                         f"{si['rows_tie_equal']:,} equal up to near-ties (within {ix['tie_eps']} of the k-th "
                         f"score); end to end (each side's own forward pass) {ee['rows_equal']:,} identical, "
                         f"{ee['rows_tie_equal']:,} equal up to near-ties")
    checks = acc.get("checks", {})
    if checks:
        lines.append("- acceptance checks (training/acceptance.py): " + ", ".join(
            f"{k} {'pass' if v else 'FAIL'}" for k, v in checks.items()))
    sample = s.get("samples", {}).get("prose")
    if sample:
        prompt, _, cont = sample.partition("|||")
        lines += ["", "## Sample (K3 model of the training run, PyTorch, temperature 0.8, top-k 40)", "",
                  f"Prompt `{prompt.replace('[BOS]', '')}` ->{cont.rstrip()}"]
    lines += ["", "## Licence", "",
              "Weights and tokenizer trained by the k3.cpp project (licence of the repository) from public-domain "
              "texts and the PSF-licensed Python 3.11 documentation; sources and licences in data/SOURCES.md.", ""]
    assert math.isfinite(acc["pytorch_ppl"])
    with open(os.path.join(a.model, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {os.path.join(a.model, 'README.md')}")


if __name__ == "__main__":
    main()
