#!/usr/bin/env bash
# bench/moe_cuda/build.sh [OUT_DIR]: builds bench_moe (the routed-expert and router kernels, their host
# references and the bench driver) with nvcc for sm_90a, and lut_emu (host emulation of the decode kernel's
# table version) with g++; standalone (no CMake); default OUT_DIR = build-moe/bench.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/build-moe/bench}
mkdir -p "$out"
rm -f "$out/bench_moe"  # so a failed compile is not hidden by the last build's binary
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I"$here/src" -I"$here/include" \
  --expt-relaxed-constexpr -DK3_MOE_VARIANTS -Xptxas -v -o "$out/bench_moe" "$here/bench/moe_cuda/bench_moe.cu" \
  "$here/src/ops/moe_experts_cuda.cu" "$here/src/ops/moe_experts_f16_cuda.cu" "$here/src/ops/moe_experts_wgmma_cuda.cu" "$here/src/ops/moe_experts_ref.cpp" "$here/src/ops/moe_route_cuda.cu" \
  "$here/src/ops/moe_route_ref.cpp" "$here/src/core/dtype.cpp" "$here/src/core/log.cpp" "$here/src/core/env.cpp" -lcublas 2>&1 |
  grep -E "error|warning|registers|spill" || true
test -x "$out/bench_moe"
echo "built $out/bench_moe"
if [ -n "${MOE_PROBES:-}" ]; then  # probe builds of the wgmma prefill kernel (wrong results; bench_moe ... time)
  for pr in $MOE_PROBES; do
    rm -f "$out/bench_moe_probe$pr"
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$here/src" -I"$here/include" \
      --expt-relaxed-constexpr -DK3_MOE_VARIANTS -DMOE_WG_PROBE="$pr" -o "$out/bench_moe_probe$pr" \
      "$here/bench/moe_cuda/bench_moe.cu" "$here/src/ops/moe_experts_cuda.cu" "$here/src/ops/moe_experts_f16_cuda.cu" "$here/src/ops/moe_experts_wgmma_cuda.cu" \
      "$here/src/ops/moe_experts_ref.cpp" "$here/src/ops/moe_route_cuda.cu" "$here/src/ops/moe_route_ref.cpp" \
      "$here/src/core/dtype.cpp" "$here/src/core/log.cpp" "$here/src/core/env.cpp" -lcublas 2>&1 | grep -E "error" || true
    test -x "$out/bench_moe_probe$pr"
    echo "built $out/bench_moe_probe$pr"
  done
fi
if [ -n "${MOE_CONTIG:-}" ]; then  # probe: the f16 decode reading each chunk's rows contiguously (wrong results;
  rm -f "$out/bench_moe_contig"    # bench_moe_contig OUT COMMIT d0: the default decode's timings)
  nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$here/src" -I"$here/include" \
    --expt-relaxed-constexpr -DK3_MOE_VARIANTS -DK3_MOE_F16_CONTIG=1 -o "$out/bench_moe_contig" \
    "$here/bench/moe_cuda/bench_moe.cu" "$here/src/ops/moe_experts_cuda.cu" "$here/src/ops/moe_experts_f16_cuda.cu" \
    "$here/src/ops/moe_experts_wgmma_cuda.cu" "$here/src/ops/moe_experts_ref.cpp" "$here/src/ops/moe_route_cuda.cu" \
    "$here/src/ops/moe_route_ref.cpp" "$here/src/core/dtype.cpp" "$here/src/core/log.cpp" "$here/src/core/env.cpp" \
    -lcublas 2>&1 | grep -E "error" || true
  test -x "$out/bench_moe_contig"
  echo "built $out/bench_moe_contig"
fi
# host emulation of the decode kernel's table version (no GPU): $out/lut_emu
g++ -std=c++20 -O2 -I"$here/src" -o "$out/lut_emu" "$here/bench/moe_cuda/lut_emu.cpp"
echo "built $out/lut_emu"
