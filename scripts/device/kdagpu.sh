#!/usr/bin/env bash
# scripts/device/kdagpu.sh: helper kdagpu's entry in the coordinator's combined device call (<= 150 s wall).
# Runs every bench_kda variant carried in .carry/kdagpu (correctness vs fp64, then timings), then fla's
# kernels in the time left, and writes
# two files to $OUT/kdagpu: run.log (everything) and kda_cuda.jsonl (one report per variant).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/kda_out}/kdagpu
tmp=/tmp/kdagpu_run
mkdir -p "$out" "$tmp"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
t0=$SECONDS
commit=$(cat .carry/kdagpu/COMMIT 2>/dev/null || echo unknown)
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  for name in ${BINS:-bench_kda_e bench_kda_f bench_kda_g bench_kda_d}; do
    echo "== $name (t=$((SECONDS - t0)) s)"
    timeout 40 ".carry/kdagpu/$name" "$tmp/ours_$name.json" all 2>&1 | grep -v conv_mismatch
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/kdagpu/whl/*.whl && export PYTHONPATH=/tmp/site
  left=$((145 - (SECONDS - t0)))
  echo "== fla (t=$((SECONDS - t0)) s, ${left} s left)"
  [ "$left" -gt 10 ] && timeout "$left" python3 bench/kda_cuda/bench_fla.py "$tmp/fla.json" 2>&1
  [ -s "$tmp/fla.json" ] || echo '{}' >"$tmp/fla.json"
  for f in "$tmp"/ours_*.json; do
    v=$(basename "$f" .json)
    v=${v#ours_}
    echo "== report $v"
    python3 bench/kda_cuda/report.py "$f" "$tmp/fla.json" "$commit" "NVIDIA H200" "$v" >>"$out/kda_cuda.jsonl"
  done 2>&1
  echo "fla json: $(cat "$tmp/fla.json")"
  echo "== done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
