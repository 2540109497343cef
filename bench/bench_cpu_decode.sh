#!/usr/bin/env bash
# bench/bench_cpu_decode.sh: CPU prefill/decode speed of one checkpoint, set against the machine's read
# bandwidth (`k3 bench`), appended as JSON lines to bench/results/cpu_decode.jsonl with the commit.
#
#   bench/bench_cpu_decode.sh [MODEL_DIR] [extra k3 bench flags...]
#   e.g. bench/bench_cpu_decode.sh models/tiny-k3 -p 128 -n 16 -b 1,4 --precision bf16 -t 2
#
# Env: K3_BIN (default build/k3), K3_MACHINE (machine label; default host + CPU).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$here/models/tiny-k3}
shift || true
bin=${K3_BIN:-$here/build/k3}
[ -x "$bin" ] || { echo "bench_cpu_decode: no k3 binary at $bin (build first: scripts/build.sh)" >&2; exit 1; }
commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null)" ]; then commit="$commit-dirty"; fi
mkdir -p "$here/bench/results"
out="$here/bench/results/cpu_decode.jsonl"
K3_COMMIT="$commit" "$bin" bench -m "$model" --bench cpu_decode --jsonl "$out" "$@"
echo "appended to $out" >&2
