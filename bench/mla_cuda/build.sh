#!/usr/bin/env bash
# bench/mla_cuda/build.sh [OUT_DIR]: builds bench_mla_decode and bench_mla_prefill (the MLA kernels, their
# fp64 references and the bench drivers) with nvcc for sm_90a, standalone (no CMake); default OUT_DIR =
# build-mla/bench. MLA_PROBES="1 2 3" also builds bench_mla_decode_probeN with -DMLA_HN_PROBE=N (the
# heads-as-N kernel's timing probes, mla_decode_wgmma_hn_cuda.cu; their results are wrong by design).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/build-mla/bench}
mkdir -p "$out"
flags=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I"$here" -I"$here/src" -I"$here/include"
  -Xptxas -v -lcublas)
decode_srcs=("$here/bench/mla_cuda/bench_mla_decode.cu" "$here"/src/ops/mla_decode*_cuda.cu
  "$here/src/ops/mla_decode_ref.cpp" "$here/src/core/env.cpp" "$here/src/core/log.cpp")
nvcc "${flags[@]}" -o "$out/bench_mla_decode" "${decode_srcs[@]}" 2>&1 |
  grep -E "error|warning|registers|spill" || true &
for n in ${MLA_PROBES:-}; do
  nvcc "${flags[@]}" -DMLA_HN_PROBE="$n" -o "$out/bench_mla_decode_probe$n" "${decode_srcs[@]}" 2>&1 |
    grep -E "error" || true &
done
nvcc "${flags[@]}" -o "$out/bench_mla_prefill" "$here/bench/mla_cuda/bench_mla_prefill.cu" \
  "$here/src/ops/mla_prefill_cuda.cu" "$here/src/ops/mla_prefill_ref.cpp" 2>&1 |
  grep -E "error|warning|registers|spill" || true
wait
test -x "$out/bench_mla_decode" && test -x "$out/bench_mla_prefill"
for n in ${MLA_PROBES:-}; do test -x "$out/bench_mla_decode_probe$n"; done
echo "built $out/bench_mla_decode $out/bench_mla_prefill${MLA_PROBES:+ and probes $MLA_PROBES}"
