#!/usr/bin/env bash
# scripts/device/mla.sh: helper mla's entry in the coordinator's combined device call (budget 75 s wall).
# MLA decode (ops/mla_decode.h: wgmma, mma.sync, CUDA-core kernels) and MLA prefill (ops/mla_prefill.h):
# test-ops cases against the fp64 references first (the wgmma kernel's descriptor probe if it fails), then
# the benches (their own checks, then timings), then k3_tests GpuModel* when packed. Builds nothing.
# Files in $OUT/mla: run.log (everything) and mla_cuda.jsonl (the benches' JSON lines).
#
#   here:   bash bench/mla_cuda/build.sh build-mla/bench; cmake --build build-mla --target test-ops [k3_tests]
#           bash scripts/device/mla.sh --pack build-mla   (test-ops, k3_tests, bench/bench_mla_{decode,prefill},
#           COMMIT and the non-CUDA shared libs into .carry/dev/mla; xz the k3_tests if over 6 MB)
#   device: bash scripts/device/mla.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
B=.carry/dev/mla
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  rm -rf "$B" && mkdir -p "$B/lib"
  cp "$build/bench/bench_mla_decode" "$build/bench/bench_mla_prefill" "$B/"
  [ -x "$build/test-ops" ] && cp "$build/test-ops" "$B/"
  [ -x "$build/k3_tests" ] && cp "$build/k3_tests" "$B/" && strip -s "$B/k3_tests"
  strip -s "$B"/* 2>/dev/null
  git rev-parse --short HEAD >"$B/COMMIT"
  for f in "$B"/test-ops "$B"/k3_tests "$B"/bench_mla_*; do [ -x "$f" ] && ldd "$f" 2>/dev/null; done | awk '/=> \//{print $3}' |
    sort -u | grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$B/lib/"
  for f in "$B"/test-ops "$B"/k3_tests; do  # the pack must stay under 6 MB: unpacked on the device
    [ -f "$f" ] && xz -T2 -6 "$f"
  done
  du -sh "$B"
  exit 0
fi
out=${OUT:-/tmp/mla_out}/mla
mkdir -p "$out"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
bin=/tmp/mla_bin
mkdir -p "$bin"
for f in "$B"/*.xz; do [ -f "$f" ] && xz -dkc "$f" >"$bin/$(basename "$f" .xz)" && chmod +x "$bin/$(basename "$f" .xz)"; done
test_ops=$bin/test-ops k3_tests=$bin/k3_tests
t0=$SECONDS
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  wg_ok=1
  if [ -x "$test_ops" ]; then
    for op in mla_decode_wgmma mla_prefill mla_decode; do
      echo "== test-ops $op (t=$((SECONDS - t0)) s)"
      timeout 10 "$test_ops" test -o "$op" -b cuda -v 2>&1 | grep -E "FAIL|fail|passed|error|nmse" | tail -14
      rc=${PIPESTATUS[0]}
      if [ "$op" = mla_decode_wgmma ] && [ "$rc" != 0 ]; then wg_ok=0; fi
    done
    if [ $wg_ok = 0 ]; then  # the MN-major descriptor probe (docs/cuda.md)
      echo "== test-ops mla_decode_wgmma, K3_MLA_WG_VDESC=1 (t=$((SECONDS - t0)) s)"
      K3_MLA_WG_VDESC=1 timeout 6 "$test_ops" test -o mla_decode_wgmma -b cuda 2>&1 | tail -3
    fi
  else
    echo "== decode checks, V descriptor swapped (t=$((SECONDS - t0)) s)"
    K3_MLA_WG_VDESC=1 K3_MLA_BENCH_CHECK_ONLY=1 timeout 7 "$B/bench_mla_decode" 2>&1 | grep -v '^{' | tail -4
  fi
  echo "== bench decode (t=$((SECONDS - t0)) s)"
  timeout 20 "$B/bench_mla_decode" "$out/mla_cuda.jsonl" "$commit" 2>&1 | grep -v '^{'
  echo "rc=${PIPESTATUS[0]} == bench prefill (t=$((SECONDS - t0)) s)"
  timeout 13 "$B/bench_mla_prefill" "$out/mla_cuda.jsonl" "$commit" 2>&1 | grep -v '^{'
  echo "rc=${PIPESTATUS[0]} (t=$((SECONDS - t0)) s)"
  if [ -x "$k3_tests" ]; then  # GPU model = CPU, incl. tiny-k3-mla and K3_MLA_FAST=1
    echo "== k3_tests GpuModel* (t=$((SECONDS - t0)) s)"
    timeout 15 "$k3_tests" --gtest_filter='*GpuModel*' 2>&1 | grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|NMSE|error" | tail -20
  fi
  echo "== done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
grep -h -o '"metric": "[^"]*", "value": [^,]*' "$out/mla_cuda.jsonl" 2>/dev/null | sed 's/"metric": //; s/, "value"//' >>"$out/run.log"
tail -c 3000 "$out/run.log"
