#!/usr/bin/env bash
# scripts/device/slicediag.sh: which switch moves which check on the K3 slice (reuses .carry/dev/slice, made
# by `bash scripts/device/slice.sh --pack BUILD`). Generates the slice in /dev/shm, then runs bench_slice's
# GPU = CPU check (--no-decode) once per switch alone, then short decode timings of the K3.1 (DSA) slice with
# and without K3_DSA_FAST=1, then k3_tests GpuKdaFast.*. Writes $OUT/slicediag/run.log; cleans /dev/shm.
#   device: bash scripts/device/slicediag.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
out=${OUT:-/tmp/slicediag_out}/slicediag
mkdir -p "$out"
B=$here/.carry/dev/slice
[ -f "$B/bin.tar.xz" ] && (cd "$B" && tar xJf bin.tar.xz)
cuda_libs=$(dirname "$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=/dev/shm/k3diag
trap 'rm -rf "$S"' EXIT
trap 'rm -rf "$S"; exit 124' TERM INT
t0=$SECONDS
el() { echo "t=$((SECONDS - t0)) s"; }
{
  echo "== k3_tests GpuKdaFast ($(el))"
  timeout 40 "$B/k3_tests" --gtest_filter='*GpuKdaFast*' 2>&1 | grep -v '^k3 info' | tail -40
  rm -rf "$S" && mkdir -p "$S"
  echo "== generate ($(el))"
  timeout 60 python3 scripts/make_k3_slice.py --out "$S/k3" --jobs "$(nproc)" 2>&1 | tail -1
  timeout 20 python3 scripts/make_k3_slice.py --out "$S/k31" --dsa --like "$S/k3" 2>&1 | tail -1
  for sw in K3_NONE=1 K3_MOE_FAST=1 K3_KDA_FAST=1 K3_MLA_FAST=1 "K3_KDA_FAST=1 K3_KDA_DECODE_TMA=1"; do
    echo "== check k3 with $sw ($(el))"
    env $sw timeout 60 "$B/bench_slice" -m "$S/k3" --no-decode 2>&1 | grep -E 'NMSE|over|intermediates'
  done
  echo "== check k31 with K3_DSA_FAST=1 ($(el))"
  K3_DSA_FAST=1 timeout 60 "$B/bench_slice" -m "$S/k31" --no-decode 2>&1 | grep -E 'NMSE|over|intermediates'
  for sw in "K3_MLA_FAST=1 K3_MOE_FAST=1" "K3_MLA_FAST=1 K3_MOE_FAST=1 K3_DSA_FAST=1"; do
    echo "== decode k31 B=1,8 T=4096 with $sw ($(el))"
    env $sw timeout 80 "$B/bench_slice" -m "$S/k31" --no-check --batches 1,8 --contexts 4096 --budget-s 60 2>&1 |
      grep -E 'B=|graphs'
  done
  echo "== done ($(el))"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
