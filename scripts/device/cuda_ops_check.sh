#!/usr/bin/env bash
# scripts/device/cuda_ops_check.sh: on the GPU machine (device tool), the CUDA backend of every op in the op
# harness: `test-ops test -b cuda -v` (every case against the fp64 reference: NMSE bound, NaN/Inf positions,
# host and device guard bytes), then `test-ops perf -b cuda` (device time per op, copies excluded). Builds
# nothing there. Logs: $OUT/cuda_ops_test.log, $OUT/cuda_ops_perf.log, $OUT/cuda_ops_check.log (summary).
#
#   here:   cmake --build build-cudaops --target test-ops      (-DK3_CUDA=ON, sm_90a)
#           bash scripts/device/cuda_ops_check.sh --pack build-cudaops   (test-ops + its non-CUDA libs into
#                                                                        .carry/cudaops)
#   device: run(command="bash scripts/device/cuda_ops_check.sh .carry/cudaops", carry=[".carry/cudaops"])
#           (any carried folder holding a CUDA test-ops works: .carry/cudamodel from gpu_check.sh --pack too)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"

if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/cudaops
  rm -rf "$dst" && mkdir -p "$dst/lib"
  cp "$build/test-ops" "$dst/" && strip -s "$dst/test-ops"
  ldd "$dst/test-ops" | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  du -sh "$dst"
  exit 0
fi

B=${1:-.carry/cudaops}
OUT=${OUT:-/tmp/cuda_ops_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/cuda_ops_check.log") 2>&1
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== $(date -u) $(nvidia-smi -L 2>&1 | head -1)"
ldd "$B/test-ops" | grep -E "not found|cublas|cudart" || true

echo "== test-ops test -b cuda"
t0=$SECONDS
timeout 240 "$B/test-ops" test -b cuda -v > "$OUT/cuda_ops_test.log" 2>&1
echo "   rc=$? in $((SECONDS - t0)) s"
grep -E "FAIL|skipped|passed," "$OUT/cuda_ops_test.log" | head -60

echo "== test-ops perf -b cuda"
t0=$SECONDS
timeout 240 "$B/test-ops" perf -b cuda -t 16 > "$OUT/cuda_ops_perf.log" 2>&1
echo "   rc=$? in $((SECONDS - t0)) s"
grep -E "gpu:| cuda " "$OUT/cuda_ops_perf.log"
echo "== done $(date -u)"
