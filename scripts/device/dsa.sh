#!/usr/bin/env bash
# scripts/device/dsa.sh: helper dsa's entry in the coordinator's combined device call (budget 45/60/75 s).
# The DSA ops (ops/dsa_index.h, dsa_topk.h, mla_sparse.h): their test-ops cases on the CUDA backend against the
# references first, then bench_dsa (its own checks, then timings and the FP8 accuracy). Builds nothing.
# Output in $OUT/dsa: run.log (everything) and dsa_cuda.jsonl (the bench's JSON lines).
#
#   here:   bash scripts/device/dsa.sh --pack BUILD   (BUILD/test-ops or BUILD/test-ops-dsa, BUILD/bench_dsa or
#           BUILD/bench/bench_dsa, BUILD/k3_tests if built (xz), COMMIT, non-CUDA shared libs -> .carry/dev/dsa)
#           e.g. cmake --build build-dsa --target test-ops k3_tests && bash bench/dsa_cuda/build.sh
#                && bash scripts/device/dsa.sh --pack build-dsa
#   device: bash scripts/device/dsa.sh [.carry/dev/dsa]
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/dev/dsa
  rm -rf "$dst" && mkdir -p "$dst/lib"
  t=$build/test-ops-dsa; [ -x "$t" ] || t=$build/test-ops
  b=$build/bench_dsa; [ -x "$b" ] || b=$build/bench/bench_dsa
  cp "$t" "$dst/test-ops" && cp "$b" "$dst/bench_dsa" && strip -s "$dst/test-ops" "$dst/bench_dsa"
  if [ -x "$build/k3_tests" ]; then  # the GPU model check with K3_DSA_FAST=1, xz-compressed
    cp "$build/k3_tests" "$dst/k3_tests" && strip -s "$dst/k3_tests" && xz -T2 -6 "$dst/k3_tests"
  fi
  git rev-parse --short HEAD >"$dst/COMMIT"
  ldd "$dst/test-ops" "$build/k3_tests" 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  du -sh "$dst"
  exit 0
fi
B=${1:-.carry/dev/dsa}
out=${OUT:-/tmp/dsa_out}/dsa
mkdir -p "$out"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
t0=$SECONDS
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  for op in dsa_key_store dsa_index dsa_topk mla_sparse; do
    echo "== test-ops $op (t=$((SECONDS - t0)) s)"
    timeout 12 "$B/test-ops" test -o $op -b cuda -v 2>&1 | grep -v -E '^ *(ok|OK)' | tail -25
  done
  if [ -e "$B/k3_tests.xz" ]; then
    echo "== GPU model = CPU with K3_DSA_FAST=1 (tiny-k31) (t=$((SECONDS - t0)) s)"
    xz -dkc "$B/k3_tests.xz" >/tmp/dsa_k3_tests && chmod +x /tmp/dsa_k3_tests
    K3_DSA_FAST=1 timeout 20 /tmp/dsa_k3_tests --gtest_filter='Families/GpuModelTiny.*/2' 2>&1 | tail -15
  fi
  commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
  echo "== bench (t=$((SECONDS - t0)) s)"
  timeout $((${DSA_BUDGET:-45} - 4 - (SECONDS - t0))) "$B/bench_dsa" "$out/dsa_cuda.jsonl" "$commit" 2>&1
  echo "rc=$? == done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
