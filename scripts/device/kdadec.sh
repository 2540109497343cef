#!/usr/bin/env bash
# scripts/device/kdadec.sh: helper kdadec's entry in the coordinator's combined device call (BUDGET s, 45-75).
# Written in session 3, which had no device: NOT YET RUN. Correctness first, then timings:
#   1. bench_kda* decode mode, each binary twice: the validated session-2 kernel (kda_fast_decode.cu, the
#      default) and the bulk-copy kernel (kda_fast_decode_tma.cu, K3_KDA_DECODE_TMA=1; binaries built with
#      KDA_FLAGS=-DKDA_DECODE_CTAS=2 or -DKDA_DECODE_TMA=0 are its variants): the fused decode step against
#      the fp64 reference at b = 1 and 64 (out, state, conv window), then b = 1 / 64 timings twice, with the
#      2 GiB device copy of the same run;
#   2. k3_tests (when packed): the GPU model with the fast KDA kernels (opt-in K3_KDA_FAST=1, set by the
#      tests themselves) vs the CPU (GpuKdaFast*), the GPU model tests of the tiny checkpoints (GpuModel*);
#   3. k3 (when packed, and time is left): a KL-48B-width 4-layer checkpoint made here by
#      scripts/make_width_checkpoints.py, `k3 bench --device cuda --precision bf16` (decode per step, prefill
#      tokens/s, ratio to the byte floor) appending JSON lines, with the generic KDA path (default) and with
#      K3_KDA_FAST=1.
# Files in $OUT/kdadec: run.log (everything), results.jsonl (bench JSON lines).
#
#   here:   KDA_NAME=bench_kda bash bench/kda_cuda/build.sh BUILD/bench   (+ variants, see above)
#           cmake --build BUILD --target k3_tests k3-cli   (BUILD configured with -DK3_CUDA=ON -DK3_TESTS=ON)
#           PACK_TESTS=1 PACK_K3=1 bash scripts/device/kdadec.sh --pack BUILD   (BUILD/bench/bench_kda*,
#           BUILD/tests/k3_tests, BUILD/k3 -> .carry/dev/kdadec/pack.tar.xz + COMMIT)
#   device: bash scripts/device/kdadec.sh                (BUDGET=45 by default)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
C=.carry/dev/kdadec
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  rm -rf "$C" /tmp/kdadec_pack && mkdir -p "$C" /tmp/kdadec_pack
  for f in "$build"/bench/bench_kda* ${PACK_TESTS:+"$build/tests/k3_tests"} ${PACK_K3:+"$build/k3"}; do
    [ -x "$f" ] && cp "$f" /tmp/kdadec_pack/ && strip -s "/tmp/kdadec_pack/$(basename "$f")"
  done
  mkdir -p /tmp/kdadec_pack/lib  # the non-CUDA shared libraries the device image may lack (httplib, xxhash)
  ls /tmp/kdadec_pack | grep -v '^lib$' | sed 's|^|/tmp/kdadec_pack/|' | xargs -r ldd 2>/dev/null |
    awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} /tmp/kdadec_pack/lib/
  tar -cJf "$C/pack.tar.xz" -C /tmp/kdadec_pack .
  git rev-parse --short HEAD >"$C/COMMIT"
  ls -la "$C"
  exit 0
fi
budget=${BUDGET:-45}
out=${OUT:-/tmp/kdadec_out}/kdadec
B=/tmp/kdadec_bin
mkdir -p "$out" "$B"
t0=$SECONDS
left() { echo $((budget - 3 - (SECONDS - t0))); }
commit=$(cat "$C/COMMIT" 2>/dev/null || echo unknown)
cuda_libs=$(dirname "$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$B/lib:${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# The tests find models/ through the source dir compiled in (/work/main): make it exist.
[ -e /work/main ] || { mkdir -p /work && ln -s "$here" /work/main; }
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  tar -xJf "$C/pack.tar.xz" -C "$B" && ls "$B"
  echo "commit $commit"
  for run in $(cd "$B" && for b in bench_kda*; do echo "$b:0" "$b:1"; done); do
    name=${run%%:*} tma=${run##*:}
    [ "$tma" = 0 ] && [ "$name" != bench_kda ] && continue  # the variants only change the TMA kernel
    [ "$(left)" -gt 8 ] || break
    echo "== $name decode, K3_KDA_DECODE_TMA=$tma (t=$((SECONDS - t0)) s)"
    K3_KDA_DECODE_TMA=$tma timeout "$(($(left) < 14 ? $(left) : 14))" "$B/$name" "/tmp/kdadec_$name$tma.json" \
      decode 2>&1
    echo "rc=$?"
    python3 - "/tmp/kdadec_$name$tma.json" "$name tma=$tma" "$commit" >>"$out/results.jsonl" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
copy = d.get("copy_GBps", [None])[0]
for k, (v, unit) in d.items():
    if k.startswith("decode_b"):
        goal = {"decode_b1_us": 8.0, "decode_b64_state_frac_of_copy": 0.9}.get(k)
        met = None if goal is None else (v <= goal if k.endswith("_us") else v >= goal)
        print(json.dumps({"bench": "kda_cuda", "commit": sys.argv[3], "machine": "NVIDIA H200",
                          "variant": sys.argv[2], "metric": k, "value": v, "unit": unit, "peer": "copy",
                          "peer_value": copy, "ratio": None, "goal": goal, "met": met}))
EOF
  done
  if [ -x "$B/k3_tests" ] && [ "$(left)" -gt 10 ]; then
    echo "== k3_tests GPU model (t=$((SECONDS - t0)) s)"
    timeout "$(($(left) < 40 ? $(left) : 40))" "$B/k3_tests" --gtest_filter="${TESTS:-*GpuKdaFast*:*GpuModel*}" \
      --gtest_brief=1 2>&1 | tail -40
  fi
  if [ -x "$B/k3" ] && [ "$(left)" -gt 25 ] && python3 -c "import ml_dtypes" 2>/dev/null; then
    echo "== kl48-w4 (t=$((SECONDS - t0)) s)"
    timeout "$(($(left) - 15))" python3 scripts/make_width_checkpoints.py --family kl --out /tmp/kl48-w4 2>&1 | tail -2
    echo "== k3 bench cuda (t=$((SECONDS - t0)) s)"
    for fast in 0 1; do
      [ -f /tmp/kl48-w4/config.json ] && [ "$(left)" -gt 5 ] && K3_KDA_FAST=$fast timeout "$(left)" "$B/k3" bench \
        -m /tmp/kl48-w4 -p 512 -n 16 -b 1,8 -r 2 --bw-mb 64 --precision bf16 --device cuda \
        --jsonl "$out/results.jsonl" --bench gpu_model 2>&1 | tail -20
    done
  fi
  echo "== done (t=$((SECONDS - t0)) s)"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
