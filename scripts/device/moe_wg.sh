#!/usr/bin/env bash
# scripts/device/moe_wg.sh: session 12's device call for the wgmma MoE prefill kernel: the *Gpu* tests,
# test-ops moe_experts on the GPU, bench_moe prefill (checks against fp64, timings of both prefill kernels),
# then Nsight Compute over one K3 prefill of 4096 tokens on each kernel (bench_moe profile).
#   here:   bash scripts/device/validate.sh --pack build-slice   (bench_moe from bench/moe_cuda/build.sh)
#   device: bash scripts/device/moe_wg.sh   ($OUT/validate/..., $OUT/ncu_moe.txt)
set -uo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-"tests ops moe"} OPS=${OPS:-moe_experts} OPS_TAIL=${OPS_TAIL:-40} MOE_MODE=${MOE_MODE:-prefill} \
  MOE_BUDGET=${MOE_BUDGET:-240} bash scripts/device/validate.sh
B=.carry/dev/validate
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [ -n "${DECODE:-1}" ]; then  # the decode kernel shares the nibble-pair rule (moe::e2m1_pair)
  echo "== bench_moe decode"
  timeout "${DECODE_BUDGET:-150}" "$B/bench_moe" "${OUT:-/tmp}/validate/moe_cuda.jsonl" "$(cat "$B/COMMIT")" decode 2>&1 |
    grep -E 'FAIL|PASS|"decode_b[0-9]+_us"' | cut -c1-220
fi
echo "== bench_moe time (K3 prefill, 4096 tokens): the default build, then each probe build"
for f in "$B/bench_moe" "$B"/bench_moe_probe*; do
  [ -x "$f" ] && echo "$(basename "$f"): $(timeout 60 "$f" /dev/null x time 2>&1 | grep -E '^time' | tr '\n' ' ')"
done
if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  echo "== ncu bench_moe profile"
  timeout "${NCU_BUDGET:-200}" ncu --kernel-name regex:'experts_wgmma' --clock-control none \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
    --print-details all "$B/bench_moe" /dev/null x profile >"${OUT:-/tmp}/ncu_moe.txt" 2>&1
  echo "rc=$?"
  grep -E 'experts_|Duration|Throughput|Pipe|Issue Slots|Executed Ipc|Stall|Warp Cycles|stall|Tensor|tensor' \
    "${OUT:-/tmp}/ncu_moe.txt" | cut -c1-160 | head -120
fi
