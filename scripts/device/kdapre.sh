#!/usr/bin/env bash
# scripts/device/kdapre.sh: helper kdapre's entry in the coordinator's combined device call (100 s budget).
# Runs the carried bench_kda binaries (correctness vs fp64 first, then timings), then the peer fla's
# chunk_kda / fused_recurrent_kda (bench_fla.py) in the time left, with the Triton cache carried in
# .carry/dev/kdapre/triton.tar.xz (and sent back, refreshed, so later calls skip fla's ~70 s compile/autotune).
# NCU=1 adds an Nsight Compute summary of each prefill kernel (first launch) before fla.
# At most 3 files in $OUT/kdapre: run.log, kda_cuda.jsonl, triton.tar.xz.
#
#   here:   bash scripts/device/kdapre.sh --pack BUILD   (BUILD/bench/bench_kda* + COMMIT + PLAN into .carry/dev/kdapre)
#           BUILD/bench/bench_kda from `bash bench/kda_cuda/build.sh BUILD/bench`; fla wheels (fla-core,
#           flash-linear-attention 0.6.0, einops) in .carry/dev/kdapre/whl (`pip download --no-deps ...`).
# The default plan (scripts/device/kdapre.PLAN) takes ~85 s before fla; fla's first chunk_kda call compiles
# and autotunes for ~70 s without the carried cache (.carry/dev/kdapre/triton.tar.xz, copied from a previous
# call's $OUT/kdapre/triton.tar.xz): give the first call ~180 s (BUDGET=180) or run FLA alone first.
#   device: bash scripts/device/kdapre.sh                (.carry/dev/kdapre/PLAN picks the runs; BUDGET=100)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
C=.carry/dev/kdapre
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  mkdir -p "$C"
  rm -f "$C"/bench_kda*
  for b in "$build"/bench/bench_kda*; do cp "$b" "$C/" && strip -s "$C/$(basename "$b")"; done
  git rev-parse --short HEAD >"$C/COMMIT"
  cp scripts/device/kdapre.PLAN "$C/PLAN"  # edit $C/PLAN after packing for another plan
  du -sh "$C"
  exit 0
fi
budget=${BUDGET:-100}
out=${OUT:-/tmp/kdapre_out}/kdapre
tmp=/tmp/kdapre_run
mkdir -p "$out" "$tmp"
export PYTHONUNBUFFERED=1
t0=$SECONDS
left() { echo $((budget - 6 - (SECONDS - t0))); }
commit=$(cat "$C/COMMIT" 2>/dev/null || echo unknown)
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  # $C/PLAN (carried, one line per run: binary mode seconds [VAR=v,VAR2=v] [tag]) says what to run; default: every binary, all, 30 s.
  plan=$(cat "$C/PLAN" 2>/dev/null || (cd "$C" && ls bench_kda* 2>/dev/null | sed 's/$/ all 30/'))
  # (optional 4th field on: VAR=value settings for that run, e.g. K3_KDA_PRE_VB=64; 5th: a tag for the report)
  while read -r name mode secs envs tag; do
    [ -n "$name" ] || continue
    tag=${tag:-$name}; envs=${envs:-K3_NONE=1}
    echo "== $tag: $name $mode ${envs:-} (t=$((SECONDS - t0)) s)"
    env ${envs//,/ } timeout "$secs" "$C/$name" "$tmp/ours_$tag.json" "$mode" 2>&1 | grep -v conv_mismatch
  done <<<"$plan"
  if [ -n "${NCU:-}" ] && command -v ncu >/dev/null; then  # NCU=1: hardware counters of each prefill kernel's first launch
    for k in kda_intra_kernel kda_state_kernel kda_prefill_kernel; do
      sw=K3_KDA_PREFILL_SPLIT=1; [ $k = kda_prefill_kernel ] && sw=K3_NONE=1
      echo "== ncu $k (t=$((SECONDS - t0)) s)"
      env $sw timeout 40 ncu --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section SchedulerStats "$C/bench_kda" /dev/null prefill 2>&1 | grep -v -E '^==PROF==|^  (prefill|copy)' | cut -c1-160
    done
  fi
  if [ "${FLA:-1}" != 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$C"/whl/*.whl && export PYTHONPATH=/tmp/site
    export TRITON_CACHE_DIR=/tmp/kdapre_triton TRITON_CACHE_AUTOTUNING=1
    mkdir -p "$TRITON_CACHE_DIR"
    [ -f "$C/triton.tar.xz" ] && tar -xJf "$C/triton.tar.xz" -C "$TRITON_CACHE_DIR"
    echo "== fla (t=$((SECONDS - t0)) s, $(($(left) - 4)) s left, cache $(du -sh "$TRITON_CACHE_DIR" | cut -f1))"
    [ "$(left)" -gt 14 ] && timeout "$(($(left) - 4))" python3 bench/kda_cuda/bench_fla.py "$tmp/fla.json" 2>&1
    tar -cJf "$out/triton.tar.xz" -C "$TRITON_CACHE_DIR" . && ls -la "$out/triton.tar.xz"
  fi
  [ -s "$tmp/fla.json" ] || echo '{}' >"$tmp/fla.json"
  for f in "$tmp"/ours_*.json; do
    [ -e "$f" ] || continue
    v=$(basename "$f" .json)
    v=${v#ours_}
    echo "== report $v"
    python3 bench/kda_cuda/report.py "$f" "$tmp/fla.json" "$commit" "NVIDIA H200" "$v" >>"$out/kda_cuda.jsonl"
  done 2>&1
  echo "fla json: $(cat "$tmp/fla.json")"
  echo "== done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
