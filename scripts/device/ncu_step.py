#!/usr/bin/env python3
"""ncu_step.py: sums an Nsight Compute CSV of one decode step by kernel.

Input: `ncu --profile-from-start off --csv --page raw --print-units base --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size ...`
(bench_slice --profile-step brackets one eager step with cudaProfilerStart / Stop). Each kernel ran alone with
cold caches (ncu's default cache control), so the sum is an upper bound of the step's kernel time.

Prints, per kernel name (template arguments and parameters dropped): launches, total us, DRAM MB moved,
GB/s and that rate over the copy rate (--copy GB/s, read + write bytes per second); then the launches in order
with the same fields when --each is given.
usage: ncu_step.py CSV [--copy 4270] [--each]
"""
import csv
import re
import sys


def short(name):
    name = re.sub(r"<?unnamed>::", "", name)  # ncu's spelling of an anonymous namespace
    name = re.sub(r"\(.*$", "", name)  # parameters
    depth, out = 0, ""
    for ch in name:  # template arguments
        depth += ch == "<"
        if depth == 0:
            out += ch
        depth -= ch == ">"
    out = out.replace("void ", "").strip()
    return out.split("::")[-1] if "::" in out else out


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    copy = float(args[args.index("--copy") + 1]) if "--copy" in args else 4270.0
    rows = []
    with open(args[0], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # drop ==PROF== and program output
    reader = csv.DictReader(lines)

    def num(r, key):  # ncu writes thousands separators ("8,512")
        return float((r.get(key) or "0").replace(",", ""))

    for r in reader:
        try:
            t = num(r, "gpu__time_duration.sum")  # ns
        except ValueError:
            continue  # the units row
        rd = num(r, "dram__bytes_read.sum")
        wr = num(r, "dram__bytes_write.sum")
        rows.append((short(r["Kernel Name"]), t / 1e3, (rd + wr) / 1e6, r.get("launch__grid_size", ""),
                     r.get("launch__block_size", "")))
    if not rows:
        sys.exit("ncu_step.py: no kernel rows in " + args[0])
    total = sum(r[1] for r in rows)
    mb = sum(r[2] for r in rows)
    print(f"{len(rows)} launches, {total:.1f} us, {mb:.1f} MB: {mb / total * 1e-3 * 1e3:.0f} GB/s "
          f"= {mb / total / copy * 1e3:.3f} of copy")
    by = {}
    for n, t, m, _, _ in rows:
        a = by.setdefault(n, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += t
        a[2] += m
    print(f"{'kernel':44s} {'n':>4s} {'us':>9s} {'share':>6s} {'MB':>9s} {'GB/s':>7s} {'/copy':>6s}")
    for n, (c, t, m) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{n[:44]:44s} {c:4d} {t:9.1f} {t / total:6.3f} {m:9.2f} {m / t * 1e3:7.0f} {m / t / copy * 1e3:6.3f}")
    if "--each" in args:
        print(f"\n{'#':>4s} {'kernel':44s} {'us':>8s} {'MB':>8s} {'/copy':>6s} grid block")
        for i, (n, t, m, g, b) in enumerate(rows):
            print(f"{i:4d} {n[:44]:44s} {t:8.2f} {m:8.2f} {m / t / copy * 1e3:6.3f} {g} {b}")


if __name__ == "__main__":
    main()
