#!/usr/bin/env bash
# scripts/device/cuda_ops_check.sh: on the GPU machine (device tool), the CUDA backend of every op in the op
# harness, op by op (this helper's ops only): `test-ops test -b cuda -v` (every case against the fp64
# reference: NMSE bound, NaN/Inf positions, host and device guard bytes) and the device tests of
# tests/cpp/test_cuda_ops.cpp when k3_tests is carried too, then `test-ops perf -b cuda` (device time per op,
# copies excluded). Builds nothing there; about a minute. Two logs: $OUT/cuda_ops_test.log (tests) and
# $OUT/cuda_ops_perf.log (timings); the summary goes to stdout.
#
#   here:   cmake --build build-cudaops --target test-ops k3_tests      (-DK3_CUDA=ON, sm_90a)
#           bash scripts/device/cuda_ops_check.sh --pack build-cudaops   (test-ops, k3_tests and their
#                                                                        non-CUDA libs into .carry/cudaops)
#   device: run(command="bash scripts/device/cuda_ops_check.sh .carry/cudaops", carry=[".carry/cudaops"])
#           (any carried folder holding a CUDA test-ops works: .carry/cudamodel from gpu_check.sh --pack too);
#           in the coordinator's combined call: scripts/device/cudaops.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"

if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/cudaops
  rm -rf "$dst" && mkdir -p "$dst/lib"
  cp "$build/test-ops" "$dst/" && strip -s "$dst/test-ops"
  [ -x "$build/tests/k3_tests" ] && cp "$build/tests/k3_tests" "$dst/" && strip -s "$dst/k3_tests"
  ldd "$dst"/* 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  du -sh "$dst"
  exit 0
fi

B=${1:-.carry/cudaops}
OUT=${OUT:-/tmp/cuda_ops_check}
mkdir -p "$OUT"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== $(date -u) $(nvidia-smi -L 2>&1 | head -1)"
ldd "$B/test-ops" | grep -E "not found|cublas|cudart" || true

ops="rms_norm layer_norm l2norm glu sigmoid softmax linear kda kda_recurrent attention"
T=$OUT/cuda_ops_test.log P=$OUT/cuda_ops_perf.log
: > "$T"; : > "$P"
budget=${BUDGET_S:-140}  # the whole script; a step that would start later is skipped (said in the log)
run_step() {  # run_step LOG LIMIT_S CMD...: appends to LOG; prints rc and seconds
  local log=$1 lim=$2; shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -le 5 ]; then echo "   skipped (time budget): $*" | tee -a "$log"; return; fi
  [ "$lim" -gt "$left" ] && lim=$left
  local t0=$SECONDS
  timeout "$lim" "$@" >> "$log" 2>&1
  echo "   rc=$? in $((SECONDS - t0)) s: $*"
}
echo "== test-ops test -b cuda"
for o in $ops; do
  echo "-- $o" >> "$T"
  run_step "$T" 25 "$B/test-ops" test -b cuda -v -o "$o"
  tail -n 1 "$T"
done
grep -E "FAIL|skipped|device error|assertion|failed:" "$T" | head -40
if [ -x "$B/k3_tests" ]; then
  echo "== k3_tests CudaContext.*:CudaOps.*:GpuArena.*" | tee -a "$T"
  run_step "$T" 40 "$B/k3_tests" --gtest_filter='CudaContext.*:CudaOps.*:GpuArena.*' --gtest_brief=1
  grep -E "FAILED|PASSED|Failure|SKIPPED|failed:" "$T" | tail -12
fi
echo "== test-ops perf -b cuda"
for o in $ops; do
  echo "-- $o" >> "$P"
  run_step "$P" 20 "$B/test-ops" perf -b cuda -t 16 -o "$o"
done
grep -E "gpu:| cuda |skipped" "$P"
echo "== done in $SECONDS s, $(date -u)"
