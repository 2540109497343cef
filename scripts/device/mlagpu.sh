#!/usr/bin/env bash
# scripts/device/mlagpu.sh: helper mlagpu's entry in the coordinator's combined device call (<= 120 s wall).
# Absorbed MLA decode over the paged latent cache (ops/mla_decode.h): the test-ops cases of both CUDA
# kernels against the fp64 reference, then bench_mla_decode (its own checks, then timings). Builds nothing.
# Two files in $OUT/mlagpu: run.log (everything) and mla_cuda.jsonl (the bench's JSON lines).
#
#   here:   bash scripts/device/mlagpu.sh --pack build-mlagpu   (test-ops, bench/bench_mla_decode, COMMIT and
#           the non-CUDA shared libs into .carry/mlagpu)
#   device: bash scripts/device/mlagpu.sh .carry/mlagpu
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/mlagpu
  rm -rf "$dst" && mkdir -p "$dst/lib"
  cp "$build/test-ops" "$build/bench/bench_mla_decode" "$dst/" && strip -s "$dst/test-ops"
  git rev-parse --short HEAD >"$dst/COMMIT"
  ldd "$dst/test-ops" 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  du -sh "$dst"
  exit 0
fi
B=${1:-.carry/mlagpu}
out=${OUT:-/tmp/mlagpu_out}/mlagpu
mkdir -p "$out"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
t0=$SECONDS
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  echo "== test-ops (t=$((SECONDS - t0)) s)"
  timeout 25 "$B/test-ops" test -o mla_decode -b cuda -v 2>&1 | tail -30
  timeout 15 "$B/test-ops" test -o mla_decode_simple -b cuda 2>&1 | tail -5
  echo "== test-ops mma2 (t=$((SECONDS - t0)) s)"
  K3_MLA_MMA2=1 timeout 15 "$B/test-ops" test -o mla_decode -b cuda 2>&1 | tail -12
  commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
  echo "== bench (t=$((SECONDS - t0)) s)"
  timeout 40 "$B/bench_mla_decode" "$out/mla_cuda.jsonl" "$commit" 2>&1
  echo "rc=$? == bench mma2 (t=$((SECONDS - t0)) s)"
  K3_MLA_MMA2=1 timeout 25 "$B/bench_mla_decode" "$out/mla_cuda.jsonl" "$commit" 2>&1
  echo "rc=$? == done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
