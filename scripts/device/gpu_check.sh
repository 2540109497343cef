#!/usr/bin/env bash
# scripts/device/gpu_check.sh: on the GPU machine (device tool), from binaries built here with -DK3_CUDA=ON and
# carried in a folder: the CUDA op harness, the GPU model tests (GPU = CPU), the CLI on --device cuda, then
# a few timings. Two files in $OUT: gpu_check.log (summary, each step's tail) and gpu_details.log (everything).
# Correctness first; each step has its own time limit (about 150 s in all).
#
#   here:   bash scripts/device-aside.sh
#           bash scripts/build.sh build-cudamodel -DK3_TESTS=ON -DK3_CUDA=ON   (targets k3_tests k3-cli test-ops)
#           bash scripts/device/gpu_check.sh --pack build-cudamodel   (copies binaries + non-CUDA libs to
#                                                                       .carry/cudamodel)
#   device: run(command="bash scripts/device/gpu_check.sh", carry=[".carry/cudamodel"])
#   here:   bash scripts/device-restore.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"

if [ "${1:-}" = "--pack" ]; then  # runs HERE: binaries + the shared libraries the device image may lack
  build=${2:?build dir}
  dst=.carry/cudamodel
  rm -rf "$dst" && mkdir -p "$dst/lib"
  for b in k3 k3_tests k3_gpu_tests test-ops; do
    for f in "$build/$b" "$build/tests/$b"; do [ -x "$f" ] && cp "$f" "$dst/" && strip -s "$dst/$b"; done
  done
  ldd "$dst"/k3* "$dst/test-ops" | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$dst/lib/"
  git rev-parse --short HEAD > "$dst/COMMIT"
  du -sh "$dst"
  exit 0
fi

B=${1:-.carry/cudamodel}
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
log=$OUT/gpu_check.log
exec > >(tee "$log") 2>&1
cuda_libs=$(dirname "$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$here/$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== $(date -u) device"; nvidia-smi -L; echo "cuBLAS from: ${cuda_libs:-?}"
# The tests find models/ through the source dir compiled in (this checkout's path here): make it exist there.
src_dir=${K3_BUILT_AT:-/work/main}
[ -e "$src_dir" ] || { mkdir -p "$(dirname "$src_dir")" && ln -s "$here" "$src_dir"; }
T=$B/k3_tests; [ -x "$T" ] || T=$B/k3_gpu_tests
ldd "$T" | grep -E "not found|cublas|cudart" || true

export K3_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
details=$OUT/gpu_details.log  # every step's whole output; the summary above keeps each one's tail
: > "$details"
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name"
  local t0=$SECONDS
  timeout "$secs" "$@" > /tmp/gpu_step.log 2>&1
  local rc=$?
  { echo "===== $name (rc=$rc)"; cat /tmp/gpu_step.log; } >> "$details"
  echo "   rc=$rc in $((SECONDS - t0)) s; tail:"; tail -n 25 /tmp/gpu_step.log | sed 's/^/   /'
}

[ "${WITH_OPS:-0}" = 1 ] && step test_ops_cuda 150 "$B/test-ops" test -b cuda  # cudaops' own script covers it
step k3_tests_gpu 75 "$T" --gtest_filter='Gpu*:Cuda*:*GpuModel*' --gtest_brief=1

# CLI: logits on both devices must agree; generation and perplexity run on cuda.
for m in tiny-kl tiny-k3 tiny-k31; do
  for d in cpu cuda; do
    timeout 30 "$B/k3" logits -m models/$m --tokens 5,17,99,3,250,7,8,9,10,11,12,13,14,15,16,1 -o "/tmp/$m-$d.npy" \
      --device $d -t 8 || echo "logits $m $d failed"
  done
  python3 - "/tmp/$m-cpu.npy" "/tmp/$m-cuda.npy" <<'EOF' || echo "compare $m failed"
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
print(f"{sys.argv[1].split('/')[-1]}: cpu vs cuda logits NMSE {float(((a - b) ** 2).sum() / (a ** 2).sum()):.3e}")
EOF
done
step run_cuda 20 "$B/k3" run -m models/tiny-k3 -p "hello world" -n 24 --temp 0 --device cuda
step ppl_cuda 20 "$B/k3" perplexity -m models/tiny-k3 -f models/heldout.txt -c 128 --max-windows 4 --device cuda
step ppl_cpu 20 "$B/k3" perplexity -m models/tiny-k3 -f models/heldout.txt -c 128 --max-windows 4 -t 8
rm -f /tmp/gpu_bench.jsonl
step bench_cuda 30 "$B/k3" bench -m models/tiny-k3 -p 64,512 -n 32 -b 1,8 -r 3 --bw-mb 64 --device cuda \
  --jsonl /tmp/gpu_bench.jsonl --bench gpu_model
# Published widths, 4 layers, 16 experts (scripts/make_width_checkpoints.py, KL-48B: D 2304, 32 KDA heads of
# 128, MLA, vocab 163840; 2.6 GB of bf16): GPU = CPU logits at real head sizes, then GPU speed.
if python3 -c "import ml_dtypes" 2>/dev/null; then
  step gen_kl48 60 python3 scripts/make_width_checkpoints.py --family kl --out /tmp/kl48-w4
  if [ -f /tmp/kl48-w4/config.json ]; then
    for d in cpu cuda; do
      timeout 40 "$B/k3" logits -m /tmp/kl48-w4 --tokens 5,17,99,3,250,7,8,9,10,11,12,13,14,15,16,1 \
        -o "/tmp/kl48-$d.npy" --device $d -t 16 || echo "logits kl48 $d failed"
    done
    python3 - /tmp/kl48-cpu.npy /tmp/kl48-cuda.npy <<'EOF' || echo "compare kl48 failed"
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
print(f"kl48-w4 fp32: cpu vs cuda logits NMSE {float(((a - b) ** 2).sum() / (a ** 2).sum()):.3e}")
EOF
    step bench_kl48_cuda 40 "$B/k3" bench -m /tmp/kl48-w4 -p 512 -n 16 -b 1,8 -r 2 --bw-mb 64 --precision bf16 \
      --device cuda --jsonl /tmp/gpu_bench.jsonl --bench gpu_model
  fi
fi
echo "== bench jsonl"; cat /tmp/gpu_bench.jsonl
echo "== done $(date -u)"
