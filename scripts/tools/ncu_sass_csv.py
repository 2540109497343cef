"""ncu_sass_csv.py FILE.csv [TOP]: digest Nsight Compute's source page (`ncu -i REP --page source --csv
--print-source sass`, as validate.sh's ncu_kda step with NCU_KDA_SRC=1 writes it): executed warp
instructions and stall samples by opcode, and the TOP hottest runs of consecutive instructions (by samples),
so the time of a kernel can be put on its phases."""
import collections
import csv
import re
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


rows = [r for r in csv.reader(open(sys.argv[1], errors="replace"))]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
head_i = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
head = [c.strip() for c in rows[head_i]]
col = {name: head.index(name) for name in head}
src_c = col["Source"]
addr_c = next((col[n] for n in head if n.startswith("Address")), None)
exe_c = next(col[n] for n in head if n.startswith("Instructions Executed") or n == "Warp Instructions Executed")
smp_c = next(col[n] for n in head if n.startswith("Warp Stall Sampling (All"))
body = [r for r in rows[head_i + 1:] if len(r) > max(src_c, exe_c, smp_c)]
op_exe, op_smp = collections.Counter(), collections.Counter()
for r in body:
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", r[src_c])
    op = m.group(2) if m else "?"
    op_exe[op] += num(r[exe_c])
    op_smp[op] += num(r[smp_c])
te, ts = sum(op_exe.values()), sum(op_smp.values())
print(f"{len(body)} instructions, {te:.4g} warp instructions executed, {ts:.4g} stall samples")
print("by opcode (executed %, samples %):")
for op, v in op_exe.most_common(20):
    print(f"  {op:10s} {100 * v / te:5.1f} {100 * op_smp[op] / ts:5.1f}")
# hottest windows of 32 consecutive instructions by samples
w = 32
sm = [num(r[smp_c]) for r in body]
ex = [num(r[exe_c]) for r in body]
win = sorted(((sum(sm[i:i + w]), i) for i in range(0, len(body), w)), reverse=True)[:top]
print(f"hottest windows of {w} instructions (samples %, executed %, first instruction):")
for s, i in win:
    a = body[i][addr_c] if addr_c is not None else str(i)
    print(f"  {100 * s / ts:5.1f} {100 * sum(ex[i:i + w]) / te:5.1f}  @{a} {body[i][src_c].strip()[:60]}")
