#!/usr/bin/env python3
"""plot_curves.py: loss curves of a device run as a PNG (dev script; needs python3-matplotlib from Debian).

    python3 training/plot_curves.py SUMMARY.json OUT.png

Left: K3 training loss (CE) per logged step and the quick held-out perplexity (16 windows, log scale, right
axis). Right (when the run has K3.1 stages): the K3.1 stages' CE and indexer KL per step, stage 1 (indexer KL,
trunk frozen, main attention dense) and stage 2 (sparse fine-tune of the MLA/DSA attention).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    summary, out = argv
    s = json.load(open(summary))
    log = s["log"]
    k3 = [r for r in log if "loss" in r and "stage" not in r]
    val = [r for r in log if "val_ppl_16w" in r]
    stages = [r for r in log if "stage" in r]
    fig, axes = plt.subplots(1, 2 if stages else 1, figsize=(12 if stages else 6.5, 4.2), squeeze=False)
    ax = axes[0][0]
    ax.plot([r["step"] for r in k3], [r["loss"] for r in k3], label="train CE")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title(f"K3: {s['steps']} steps, {s['tokens_seen'] / 1e6:.1f} M tokens")
    if val:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in val], [r["val_ppl_16w"] for r in val], "o-", color="tab:red",
                 label="held-out ppl (16 windows)")
        if "held_out" in s:
            ax2.plot([s["steps"]], [s["held_out"]["ppl"]], "D", color="tab:purple",
                     label=f"final held-out ppl ({s['held_out']['windows']} windows)")
        ax2.set_yscale("log")
        ax2.set_ylabel("held-out perplexity")
        ax2.legend(loc="center right")
    ax.legend(loc="upper center")
    if stages:
        ax = axes[0][1]
        kl_ax = ax.twinx()
        off = 0
        for name, color in (("indexer_kl", "tab:blue"), ("sparse_finetune", "tab:green")):
            rs = [r for r in stages if r["stage"] == name]
            if not rs:
                continue
            x = [off + r["step"] for r in rs]
            ax.plot(x, [r["loss"] for r in rs], "o-", color=color, ms=3, label=f"{name}: CE")
            kl_ax.plot(x, [r["kl"] for r in rs], "s--", color=color, ms=3, alpha=0.6, label=f"{name}: indexer KL")
            off = x[-1]
        ax.set_xlabel("K3.1 step (stage 1, then stage 2)")
        ax.set_ylabel("CE (nats/token), solid")
        kl_ax.set_ylabel("indexer KL (nats), dashed")
        ax.set_title("K3.1 from the K3 trunk")
        ax.legend(loc="upper left")
        kl_ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
