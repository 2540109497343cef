"""report.py: merges bench_kda's and bench_fla's JSON (same run) into bench/results/kda_cuda.jsonl lines
and a markdown table with the ratios and goals of issue 6.

    python3 report.py ours.json fla.json COMMIT MACHINE [VARIANT] > lines.jsonl   (the table goes to stderr)
"""
import json
import sys

def load(path):  # a run cut short leaves an unterminated object (bench_kda) or nothing
    text = open(path).read().strip()
    for t in (text, text + "}"):
        try:
            return json.loads(t) if t else {}
        except json.JSONDecodeError:
            pass
    return {}


ours, fla = (load(p) for p in sys.argv[1:3])
commit, machine = sys.argv[3], sys.argv[4]
variant = sys.argv[5] if len(sys.argv) > 5 else None


def val(d, k):
    return d[k][0] if k in d else None


def best_fla(name):  # fastest chunk_kda variant (default, safe_gate) at this shape
    vs = [v[0] for k, v in fla.items() if k.startswith(f"fla_prefill_{name}_") and k.endswith("_ms")]
    return min(vs) if vs else None


rows = []
fixed_ratio = None
for name in ["T2048", "T8192", "T131072", "varlen8x1024"]:
    o, pv = val(ours, f"prefill_{name}_ms"), best_fla(name)
    if o is None:
        continue
    ratio = pv / o if pv else None
    goal, met = None, None
    if name == "T8192":
        fixed_ratio = ratio
        goal, met = ">= 4x fla", (ratio is not None and ratio >= 4)
    if name == "varlen8x1024" and fixed_ratio is not None and ratio is not None:
        goal, met = f">= fixed-case speed-up ({fixed_ratio:.2f}x)", ratio >= fixed_ratio
    rows.append((f"prefill_{name}_ms", o, "ms", "fla chunk_kda (best variant)", pv, ratio, goal, met))
copy = val(ours, "copy_GBps")
for b in (1, 64):
    o, pv = val(ours, f"decode_b{b}_us"), val(fla, f"fla_decode_b{b}_us")
    if o is None:
        continue
    goal, met = (("<= 8 us", o <= 8) if b == 1 else (None, None))
    rows.append((f"decode_b{b}_us", o, "us", "fla fused_recurrent_kda", pv, pv / o if pv else None, goal, met))
    if b == 64 and copy:
        fr = val(ours, "decode_b64_state_frac_of_copy")
        pg = val(fla, "fla_decode_b64_state_GBps")
        rows.append(("decode_b64_state_frac_of_copy", fr, "ratio", "fla fused_recurrent_kda",
                     pg / copy if pg else None, fr / (pg / copy) if pg else None, ">= 0.9", fr >= 0.9))
for m, peer, goal in [("prefill_T8192_relrms_o", "fla_prefill_T8192_relrms_o", 3e-3),
                      ("prefill_T8192_relrms_state", "fla_prefill_T8192_relrms_state", 3e-3),
                      ("decode_b1_relrms_out", None, 1e-3), ("decode_b64_relrms_out", None, 1e-3),
                      ("decode_b64_relrms_state", None, 1e-3)]:
    o = val(ours, m)
    if o is None:
        continue
    pv = val(fla, peer) if peer else None
    rows.append((m, o, "rel", "fla chunk_kda" if peer else None, pv, None, f"<= {goal:g}", o <= goal))

print("| metric | ours | unit | peer | peer value | ratio (peer/ours) | goal | met |", file=sys.stderr)
print("|---|---|---|---|---|---|---|---|", file=sys.stderr)
for m, o, u, peer, pv, ratio, goal, met in rows:
    f = lambda x: "" if x is None else f"{x:.4g}"
    print(f"| {m} | {f(o)} | {u} | {peer or ''} | {f(pv)} | {f(ratio)} | {goal or ''} | "
          f"{'' if met is None else ('yes' if met else 'no')} |", file=sys.stderr)
    line = {"bench": "kda_cuda", "commit": commit, "machine": machine, "metric": m, "value": o, "unit": u,
            "peer": peer, "peer_value": pv, "ratio": ratio, "goal": goal, "met": met}
    if variant:
        line["variant"] = variant
    print(json.dumps(line))
