#!/usr/bin/env bash
# scripts/device/combined.sh: the coordinator's combined device call. Runs each helper's device script in turn,
# each under its own wall-time budget, then tars each helper's $OUT/<name>/ into $OUT/<name>.tgz (the device tool
# brings back at most 8 files).
#
#   device: bash scripts/device/combined.sh kdapre:100 mla:45 dsa:45 ...
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set (the device tool sets it)}"
t0=$SECONDS
# the non-CUDA shared libraries each helper packed (cpp-httplib, xxhash, ...), for every helper's binaries
for d in .carry/dev/*/lib; do [ -d "$d" ] && LD_LIBRARY_PATH=$PWD/$d:${LD_LIBRARY_PATH:-}; done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv,noheader
for spec in "$@"; do
  name=${spec%%:*}; budget=${spec##*:}
  mkdir -p "$OUT/$name"
  echo "== $name (budget ${budget} s, t=$((SECONDS - t0)) s)"
  s=$SECONDS
  timeout -k 5 "$budget" bash "scripts/device/$name.sh" >"$OUT/$name/stdout.log" 2>&1
  echo "   rc=$? wall=$((SECONDS - s)) s"
  tail -n 4 "$OUT/$name/stdout.log" | cut -c1-300
done
for spec in "$@"; do
  name=${spec%%:*}
  tar -czf "$OUT/$name.tgz" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
done
echo "== all done t=$((SECONDS - t0)) s"
