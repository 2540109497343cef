#!/usr/bin/env bash
# scripts/device/dist_nccl.sh: the NCCL communicator tests (tests/cpp/test_dist_nccl.cpp) on the GPU machine:
# world size 1 on one GPU (and 2 when two GPUs are visible), then the CPU parallel tests as a cross-check.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, as the device notes require).
#
#   here:   bash scripts/device-aside.sh
#           bash scripts/build.sh build-dist-cuda -DK3_TESTS=ON -DK3_CUDA=ON -DK3_NCCL=ON   (target k3_tests)
#           bash scripts/device/dist_nccl.sh --pack build-dist-cuda     (binary + non-CUDA libs to .carry/dist)
#   device: run(command="bash scripts/device/dist_nccl.sh", carry=[".carry/dist"])
#   here:   bash scripts/device-restore.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"

if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  dst=.carry/dist
  rm -rf "$dst" && mkdir -p "$dst/lib"
  cp "$build/tests/k3_tests" "$dst/" 2>/dev/null || cp "$build/k3_tests" "$dst/" && strip -s "$dst/k3_tests"
  ldd "$dst/k3_tests" | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libnccl|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  du -sh "$dst"
  exit 0
fi

B=${1:-.carry/dist}
OUT=${OUT:-/tmp/dist_nccl}
mkdir -p "$OUT"
exec > >(tee "$OUT/dist_nccl.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl=$(dirname "$(find /usr /opt /root -name 'libnccl.so.2*' 2>/dev/null | head -1)" 2>/dev/null)
cublas=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${nccl:-}:${cublas:-}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== $(date -u)"; nvidia-smi -L; echo "NCCL from: ${nccl:-?}"
src_dir=${K3_BUILT_AT:-/work/main}  # the tests find models/ through the source dir compiled in
[ -e "$src_dir" ] || { mkdir -p "$(dirname "$src_dir")" && ln -s "$here" "$src_dir"; }
ldd "$B/k3_tests" | grep -E "not found|nccl" || true
echo "== NCCL tests"
timeout 120 "$B/k3_tests" --gtest_filter='DistNccl*' ; echo "rc=$?"
echo "== CPU parallel tests"
timeout 240 "$B/k3_tests" --gtest_filter='DistComm*:DistEp*:KdaTransition*:DistTp*:Kcp*' --gtest_brief=1 ; echo "rc=$?"
