#!/usr/bin/env bash
# bench/mla_cuda/build.sh [OUT_DIR]: builds bench_mla_decode (the MLA decode kernels, their fp64 reference
# and the bench driver) with nvcc for sm_90a, standalone (no CMake); default OUT_DIR = build-mlagpu/bench.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/build-mlagpu/bench}
mkdir -p "$out"
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I"$here/src" -I"$here/include" \
  -Xptxas -v -o "$out/bench_mla_decode" "$here/bench/mla_cuda/bench_mla_decode.cu" \
  "$here/src/ops/mla_decode_cuda.cu" "$here/src/ops/mla_decode_ref.cpp" 2>&1 |
  grep -E "error|warning|registers|spill" || true
test -x "$out/bench_mla_decode"
echo "built $out/bench_mla_decode"
