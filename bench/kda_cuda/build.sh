#!/usr/bin/env bash
# bench/kda_cuda/build.sh [OUT_DIR]: builds bench_kda (the fast KDA kernels, their fp64 references and the
# bench driver) with nvcc for sm_90a, standalone (no CMake); default OUT_DIR = build-kdagpu/bench.
# KDA_FLAGS adds nvcc flags (-DKDA_PRE_VB=64, ...), KDA_NAME names the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/build-kdagpu/bench}
mkdir -p "$out"
flags=(${KDA_FLAGS:-} -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo
       -I"$here/src" -I"$here/include")
nvcc "${flags[@]}" -Xptxas -v -o "$out/${KDA_NAME:-bench_kda}" "$here/bench/kda_cuda/bench_kda.cu" \
  "$here"/src/ops/kda_fast_prefill*.cu "$here"/src/ops/kda_fast_decode*.cu "$here/src/ops/kda_fast_ref.cpp" \
  "$here/src/core/env.cpp" "$here/src/core/log.cpp" \
  -Xcompiler -pthread 2>&1 | grep -E "error|warning|registers|spill" || true
test -x "$out/${KDA_NAME:-bench_kda}"
echo "built $out/${KDA_NAME:-bench_kda}"
