#!/usr/bin/env bash
# scripts/device/moe.sh: helper moe's entry in the coordinator's combined device call.
# The routed MXFP4 experts and the router selection (ops/moe_experts.h, ops/moe_route.h): test-ops cases of
# the CUDA backends against the references (when test-ops is packed), the GPU-model tests with the opt-in
# fused MoE path (K3_MOE_FAST=1; when k3_tests is packed), then bench_moe (its own checks at K3's shapes,
# then timings against the copy bandwidth and the cuBLAS bf16 rate). Builds nothing.
# Build first: bash bench/moe_cuda/build.sh; bash scripts/build.sh build-moe -DK3_TESTS=ON -DK3_CUDA=ON
# (or cmake --build build-moe --target test-ops k3_tests).
# Files in $OUT/moe: run.log (everything) and moe_cuda.jsonl (the bench's JSON lines).
#
#   here:   bash scripts/device/moe.sh --pack build-moe   (bench_moe [+ test-ops, libs] into .carry/dev/moe)
#   device: bash scripts/device/moe.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/dev/moe
  rm -rf "$dst" && mkdir -p "$dst/lib"
  cp "$build/bench/bench_moe" "$dst/" && strip -s "$dst/bench_moe"
  for bin in test-ops tests/k3_tests; do
    [ -x "$build/$bin" ] && cp "$build/$bin" "$dst/" && strip -s "$dst/$(basename "$bin")"
  done
  if [ -x "$dst/test-ops" ] || [ -x "$dst/k3_tests" ]; then
    ldd $(ls "$dst"/test-ops "$dst"/k3_tests 2>/dev/null) 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
      grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
      xargs -r -I{} cp -L {} "$dst/lib/"
  fi
  # the call carries at most ~6 MB per helper: the test binaries travel xz-compressed
  bins=$(cd "$dst" && ls test-ops k3_tests 2>/dev/null)
  if [ -n "$bins" ]; then
    (cd "$dst" && tar -cJf tests.tar.xz $bins && rm -f $bins)
  fi
  git rev-parse --short HEAD >"$dst/COMMIT"
  du -sh "$dst"
  exit 0
fi
B=.carry/dev/moe
out=${OUT:-/tmp/moe_out}/moe
mkdir -p "$out"
[ -f "$B/tests.tar.xz" ] && tar -xJf "$B/tests.tar.xz" -C "$B"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
budget=${MOE_BUDGET:-45}
t0=$SECONDS
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  if [ -x "$B/test-ops" ]; then
    echo "== test-ops moe (t=$((SECONDS - t0)) s)"
    for o in moe_route moe_experts; do timeout 15 "$B/test-ops" test -o $o -b cuda -v 2>&1 | tail -16; done
  fi
  if [ -x "$B/k3_tests" ]; then
    echo "== k3_tests GpuModel with K3_MOE_FAST=1 (t=$((SECONDS - t0)) s)"
    K3_MOE_FAST=1 timeout 20 "$B/k3_tests" --gtest_filter='*GpuModel*' 2>&1 | grep -E "OK|FAILED|PASSED|NMSE|Failure" | tail -25
  fi
  commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
  left=$((budget - 3 - (SECONDS - t0)))
  echo "== bench_moe (t=$((SECONDS - t0)) s, limit ${left} s)"
  timeout "$left" "$B/bench_moe" "$out/moe_cuda.jsonl" "$commit" 2>&1
  echo "rc=$? == done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
