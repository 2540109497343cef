#!/usr/bin/env bash
# scripts/device/slice.sh: helper slice's entry in the coordinator's combined device call (budget in
# /tmp/devq/slice). The K3 slice (scripts/make_k3_slice.py: K3's full per-layer widths, 4 layers) made on
# the device in /dev/shm, GPU = CPU checks on it, then the decode bench (bench/slice). Builds nothing.
# Writes $OUT/slice/run.log and $OUT/slice/slice.jsonl; removes everything it put in /dev/shm.
# Not yet run on a GPU (session 3 had no device). Next session, e.g. in a 120 s slot:
#   SLICE_BUDGET=120 SLICE_GEN_S=40 SLICE_LOGITS_S=30 SLICE_BENCH_S=60 bash scripts/device/slice.sh --pack BUILD
# SLICE_BENCH_ENV='K3_MLA_FAST=1 ...' runs the tests and the bench with those switches; SLICE_TEST_FILTER picks tests.
# (SLICE_EXPERTS=64 makes a 13 GB slice when the full 57.6 GB one does not fit the slot.)
#
#   here:   bash scripts/device/slice.sh --pack BUILD    (k3, bench_slice, k3_tests, COMMIT -> .carry/dev/slice)
#   device: bash scripts/device/slice.sh                  (SLICE_EXPERTS=896 by default, SLICE_STEPS=...)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
dst=.carry/dev/slice
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  rm -rf "$dst" && mkdir -p "$dst"
  for f in k3 bench_slice tests/k3_tests; do
    [ -x "$build/$f" ] && cp "$build/$f" "$dst/" && strip -s "$dst/$(basename "$f")"
  done
  git rev-parse --short HEAD >"$dst/COMMIT"
  for v in $(compgen -v SLICE_); do printf '%s=%q\n' "$v" "${!v}"; done >"$dst/CONFIG"  # SLICE_* travel along
  if [ "$(du -sb "$dst" | cut -f1)" -gt 6000000 ]; then
    (cd "$dst" && tar cJf bin.tar.xz k3 bench_slice k3_tests 2>/dev/null; rm -f k3 bench_slice k3_tests)
  fi
  du -sh "$dst"; ls -la "$dst"
  exit 0
fi
out=${OUT:-/tmp/slice_out}/slice
mkdir -p "$out"
B=$here/$dst
set -a; [ -f "$B/CONFIG" ] && . "$B/CONFIG"; set +a
[ -f "$B/bin.tar.xz" ] && (cd "$B" && tar xJf bin.tar.xz)
cuda_libs=$(dirname "$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=/dev/shm/k3slice
cleanup() { rm -rf "$S"; }
trap cleanup EXIT
trap 'cleanup; exit 124' TERM INT
t0=$SECONDS
el() { echo "t=$((SECONDS - t0)) s"; }
tm() {  # tm LABEL CMD...: runs CMD, then prints LABEL: wall seconds and the exit status
  local label=$1 a=$EPOCHREALTIME rc; shift
  "$@"; rc=$?
  awk -v a="$a" -v b="$EPOCHREALTIME" -v l="$label" -v rc="$rc" 'BEGIN { printf "%s: %.2f s wall, rc=%d\n", l, b - a, rc }'
}
commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
E=${SLICE_EXPERTS:-896}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv,noheader
  nproc; free -g | head -2; df -h /dev/shm | tail -1
  python3 -c "import numpy; print('numpy', numpy.__version__)"
  if [ -x "$B/k3_tests" ]; then  # CUDA-graph decode steps = eager, bit for bit (tiny models)
    echo "== k3_tests GpuGraph.* ($(el))"
    env ${SLICE_BENCH_ENV:-} timeout "${SLICE_TESTS_S:-60}" "$B/k3_tests" --gtest_filter="${SLICE_TEST_FILTER:-GpuGraph.*}" 2>&1 |
      grep -v -E '^k3 info' | tail -"${SLICE_TEST_LINES:-25}"
  fi
  echo "== generate K3 slice, $E experts ($(el))"
  rm -rf "$S" && mkdir -p "$S"
  timeout "${SLICE_GEN_S:-60}" python3 scripts/make_k3_slice.py --out "$S/k3" ${SLICE_TINY:+--tiny} --experts "$E" --jobs "$(nproc)" 2>&1 | tail -3
  echo "rc=$? $(el); du: $(du -sbL "$S/k3" 2>/dev/null | cut -f1) bytes"
  echo "== K3.1 variant (--like) ($(el))"
  timeout 20 python3 scripts/make_k3_slice.py --out "$S/k31" ${SLICE_TINY:+--tiny} --experts "$E" --dsa --like "$S/k3" 2>&1 | tail -3
  echo "rc=$? $(el)"
  toks=1,2,3,100,1000,517,1023,42
  for m in ${SLICE_MODELS-k3 k31}; do
    echo "== $m: k3 logits fp32 cuda vs cpu, 8 tokens ($(el))"
    tm cuda timeout "${SLICE_LOGITS_S:-60}" "$B/k3" logits -m "$S/$m" --tokens $toks \
      --device cuda -o "$S/${m}_cuda.npy" 2>&1 | tail -3
    tm cpu timeout "${SLICE_LOGITS_S:-60}" "$B/k3" logits -m "$S/$m" --tokens $toks \
      --device cpu -o "$S/${m}_cpu.npy" 2>&1 | tail -3
    python3 - "$S/${m}_cuda.npy" "$S/${m}_cpu.npy" <<'EOF'
import sys, numpy as np
a, b = np.load(sys.argv[1]).astype(np.float64), np.load(sys.argv[2]).astype(np.float64)
print(f"logits {a.shape}: NMSE(cuda, cpu) = {((a - b) ** 2).sum() / (b ** 2).sum():.3e}, std {b.std():.3f}")
EOF
    rm -f "$S/${m}_cuda.npy" "$S/${m}_cpu.npy"
  done
  if [ -x "$B/bench_slice" ]; then
    echo "== bench_slice ($(el))"
    bs=${SLICE_BENCH_S:-60}
    echo "bench env: ${SLICE_BENCH_ENV:-(defaults)}"
    env ${SLICE_BENCH_ENV:-} timeout "$bs" "$B/bench_slice" -m "$S/k3" -m31 "$S/k31" --jsonl "$out/slice.jsonl" --commit "$commit" \
      --budget-s "$((bs - 5))" ${SLICE_BENCH_ARGS:-} 2>&1
    echo "rc=$? $(el)"
  fi
  if [ "${SLICE_GEN_FULL:-0}" = 1 ]; then  # the 896-expert generation rate, cut at the budget
    rm -rf "$S" && mkdir -p "$S"
    left=$(( ${SLICE_BUDGET:-45} - (SECONDS - t0) - 8 ))
    echo "== generate the full slice (896 experts), ${left} s allowed ($(el))"
    [ "$left" -gt 3 ] && timeout "$left" python3 scripts/make_k3_slice.py --out "$S/full" --jobs "$(nproc)" 2>&1 | tail -2
    echo "rc=$? $(el); written: $(du -sb "$S/full" 2>/dev/null | cut -f1) bytes (of 57.6e9)"
    rm -rf "$S"; echo "removed $(el)"
  fi
  echo "== done ($(el))"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
