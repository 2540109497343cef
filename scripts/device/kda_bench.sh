#!/usr/bin/env bash
# scripts/device/kda_bench.sh [all|quick|check|time] [COMMIT]: on the GPU machine, checks the fast KDA
# kernels against the fp64 references and times them, then times fla's Triton kernels (the peer) at the
# same shapes in the same run. Expects the binaries named in $BINS (default bench_kda; built by
# bench/kda_cuda/build.sh) in .carry/kdagpu (rebuilt here when one does not run) and the fla wheels in
# .carry/kdagpu/whl. FLA=0 skips fla. Writes ours_<bin>.json/.log, fla.json/.log, kda_cuda.jsonl (from
# the first binary) and the table to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kda_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mode=${1:-all}
commit=${2:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/nvsmi.txt"
first=
for name in ${BINS:-bench_kda}; do
  bin=.carry/kdagpu/$name
  if ! "$bin" /dev/null none >/dev/null 2>&1; then
    echo "carried $name does not run here; building bench_kda"
    bash bench/kda_cuda/build.sh /tmp/kb && bin=/tmp/kb/bench_kda
  fi
  echo "== $name"
  "$bin" "$OUT/ours_$name.json" "$mode" 2>&1 | tee "$OUT/ours_$name.log"
  first=${first:-$name}
done
if [ "${FLA:-1}" != 0 ] && [ "$mode" != check ] && ls .carry/kdagpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/kdagpu/whl/*.whl && export PYTHONPATH=/tmp/site
  timeout "${FLA_TIMEOUT:-300}" python3 bench/kda_cuda/bench_fla.py "$OUT/fla.json" 2>&1 | tee "$OUT/fla.log"
  [ -s "$OUT/fla.json" ] || echo '{}' >"$OUT/fla.json"
  python3 bench/kda_cuda/report.py "$OUT/ours_$first.json" "$OUT/fla.json" "$commit" "NVIDIA H200" \
    >"$OUT/kda_cuda.jsonl" 2>"$OUT/table.md"
  cat "$OUT/table.md"
fi
