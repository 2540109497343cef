#!/usr/bin/env bash
# scripts/device/probe.sh: timings and Nsight Compute counters of the decode kernels under work (session 5):
#   1. bench_moe decode (K3 shapes: checks vs the fp64 reference, then b = 1 / 8 / 64 timings);
#   2. ncu on the K3 decode check's launches of bench_moe (n_tok = 1: the gate/up and the down kernel);
#   3. ncu on bench_kda decode: one b = 1 timing launch and one b = 64 launch (the TMA kernel);
#   4. kda: bench_kda decode (checks vs fp64, then b = 1 / 64 timings, twice), with the defaults and with the
#      persistent kernel (K3_KDA_DECODE_TMA=2);
#   6. kdapre: bench_kda quick (prefill and decode checks vs fp64, prefill T = 2048 / 8192 / 8 x 1024 and decode
#      timings) with the default build and each bench_kdapre_<name> (e.g. -DKDA_PRE_INTRA_V=1, the old pre-pass);
#   5. kdavar: bench_kda decode of every variant binary packed (bench_kda_<name>, built with KDA_FLAGS, e.g.
#      the timing probes -DKDA_DECODE_PROBE=1/2/3 that leave out the state's store / load, or -DKDA_DECODE_NT=512).
#   7. moecontig: bench_moe and bench_moe_contig (MOE_CONTIG=1 moe_cuda/build.sh: the f16 decode reading each
#      chunk's rows as one contiguous block, wrong results) d0 timings, twice, alternating; ncu_contig: ncu of both.
# PROBE="moe ncu_moe ncu_kda kda" picks steps (default: the first three). Writes $OUT/probe/run.log, moe_cuda.jsonl.
#   here:   bash scripts/device/probe.sh --pack BUILD_BENCH_DIR   (bench_moe, bench_kda -> .carry/dev/probe)
#   device: bash scripts/device/probe.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
B=$here/.carry/dev/probe
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?bench build dir}
  rm -rf "$B" && mkdir -p "$B"
  names=$(cd "$build" && ls bench_moe bench_moe_contig bench_kda bench_kda_* bench_kdapre_* 2>/dev/null)
  for f in $names; do cp "$build/$f" "$B/" && strip -s "$B/$f"; done
  (cd "$B" && tar cJf bin.tar.xz $names && rm -f $names)
  git rev-parse --short HEAD >"$B/COMMIT"
  du -sh "$B"
  exit 0
fi
out=${OUT:-/tmp/probe_out}/probe
mkdir -p "$out"
(cd "$B" && tar xJf bin.tar.xz)
cuda_libs=$(dirname "$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
t0=$SECONDS
el() { echo "t=$((SECONDS - t0)) s"; }
PROBE=${PROBE:-moe ncu_moe ncu_kda}
on() { [[ " $PROBE " == *" $1 "* ]]; }
sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis"
commit=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
{
  echo "commit $commit, steps: $PROBE"
  if on moe; then
    echo "== bench_moe decode ($(el))"
    timeout 150 "$B/bench_moe" "$out/moe_cuda.jsonl" "$commit" decode 2>&1
  fi
  if on ncu_moe && command -v ncu >/dev/null; then
    echo "== ncu bench_moe decode: the K3 decode check's two expert kernels ($(el))"
    timeout 90 ncu --clock-control none -k regex:experts_decode -c 2 $sections "$B/bench_moe" /dev/null x decode 2>&1 |
      grep -v -E '^==PROF==|^check|^  decode' | cut -c1-170
  fi
  if on moecontig && [ -x "$B/bench_moe_contig" ]; then  # MOE_CONTIG=1 moe_cuda/build.sh: the layout probe
    for i in 1 2; do
      for v in bench_moe bench_moe_contig; do
        echo "== $v d0, round $i ($(el))"
        timeout 60 "$B/$v" "$out/moe_cuda_$v.jsonl" "$commit" d0 2>&1 | grep -E "decode_b|copy" | cut -c1-120
      done
    done
  fi
  if on ncu_contig && command -v ncu >/dev/null; then  # the two f16 decode kernels of the b1 check, both builds
    for v in bench_moe bench_moe_contig; do
      echo "== ncu $v d0: the K3 b1 check's two f16 decode kernels ($(el))"
      timeout 90 ncu --clock-control none -k regex:experts_decode_f16 -c 2 $sections "$B/$v" /dev/null x d0 2>&1 |
        grep -v -E '^==PROF==|^check|^  decode' | cut -c1-170
    done
  fi
  if on ncu_kda && command -v ncu >/dev/null; then
    echo "== ncu bench_kda decode: b = 1 timing launch, b = 64 TMA launch ($(el))"
    timeout 60 ncu --clock-control none -k regex:kda_decode -s 3 -c 1 $sections "$B/bench_kda" /dev/null decode 2>&1 |
      grep -v -E '^==PROF==' | cut -c1-170 | grep -v "^decode\|^check"
    timeout 60 ncu --clock-control none -k regex:kda_decode -s 1 -c 1 $sections "$B/bench_kda" /dev/null decode 2>&1 |
      grep -v -E '^==PROF==' | cut -c1-170 | grep -v "^decode\|^check"
  fi
  if on kda; then
    echo "== bench_kda decode ($(el))"
    timeout 40 "$B/bench_kda" "$out/kda_cuda.json" decode 2>&1 | grep -v conv_mismatch
    echo "== bench_kda decode, K3_KDA_DECODE_TMA=2: the persistent kernel ($(el))"
    K3_KDA_DECODE_TMA=2 timeout 40 "$B/bench_kda" "$out/kda_cuda_ring.json" decode 2>&1 | grep -v conv_mismatch
  fi
  if on kdapre; then
    for v in "$B"/bench_kda "$B"/bench_kdapre_*; do
      [ -x "$v" ] || continue  # an unmatched pattern
      echo "== $(basename "$v") quick ($(el))"
      timeout 60 "$v" "$out/$(basename "$v")_quick.json" quick 2>&1 | grep -v conv_mismatch | cut -c1-200
    done
  fi
  if on kdavar; then
    for v in "$B"/bench_kda_*; do
      [ -x "$v" ] || continue
      echo "== $(basename "$v") decode ($(el))"
      timeout 40 "$v" "$out/$(basename "$v").json" decode 2>&1 | grep -v conv_mismatch | grep -E "decode_b|check" | cut -c1-200
    done
  fi
  echo "== done ($(el))"
} >"$out/run.log" 2>&1
tail -c 3000 "$out/run.log"
