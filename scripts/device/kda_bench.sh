#!/usr/bin/env bash
# scripts/device/kda_bench.sh [all|check|time] [COMMIT]: on the GPU machine, checks the fast KDA kernels
# against the fp64 references and times them and fla's Triton kernels (the peer) at the same shapes, in one
# run. Expects .carry/kdagpu/bench_kda (bench/kda_cuda/build.sh; rebuilt here if it does not run) and the
# fla wheels in .carry/kdagpu/whl. Writes ours.json, fla.json, kda_cuda.jsonl and logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kda_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mode=${1:-all}
commit=${2:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/nvsmi.txt"
bin=.carry/kdagpu/bench_kda
if ! "$bin" /dev/null none >/dev/null 2>&1; then
  echo "carried bench_kda does not run here; building it"
  bash bench/kda_cuda/build.sh /tmp/kb && bin=/tmp/kb/bench_kda
fi
"$bin" "$OUT/ours.json" "$mode" 2>&1 | tee "$OUT/ours.log"
if [ "$mode" != check ] && ls .carry/kdagpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/kdagpu/whl/*.whl && export PYTHONPATH=/tmp/site
  timeout "${FLA_TIMEOUT:-300}" python3 bench/kda_cuda/bench_fla.py "$OUT/fla.json" 2>&1 | tee "$OUT/fla.log"
  [ -s "$OUT/fla.json" ] || echo '{}' >"$OUT/fla.json"
  python3 bench/kda_cuda/report.py "$OUT/ours.json" "$OUT/fla.json" "$commit" "NVIDIA H200" \
    >"$OUT/kda_cuda.jsonl" 2>"$OUT/table.md"
  cat "$OUT/table.md"
fi
