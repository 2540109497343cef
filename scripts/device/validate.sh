#!/usr/bin/env bash
# scripts/device/validate.sh: one short device run that checks the defaults chosen in session 4 (two-kernel
# KDA prefill, KDA decode kernel by batch, MLA decode kernel by size, fused MoE and DSA ops in the GPU model):
#   1. k3_tests, every GPU test (*Gpu*), with the defaults;
#   2. bench_kda quick (prefill and decode checks against fp64, then timings) with the defaults;
#   3. test-ops, the CUDA cases of the MLA decode kernels (both picked by size now);
#   4. the K3 and K3.1 slices: bench_slice's GPU = CPU checks and decode timings at B = 1 / 64, T = 4K / 128K
#      with the defaults (K3.1: DSA over ops/mla_sparse.h), then K3's with K3_MLA_FAST=0 (the generic MLA);
#      SLICE_BATCHES / SLICE_CTX / SLICE_BUDGET / SLICE_TIMEOUT widen the grid (1,64 / 4096,131072 / 70 / 90);
#      slice_old: the same timings with BUILD/bench_slice_old (an earlier commit's, named by OLD_COMMIT at
#      --pack), in the same call;
#   5. fused: the fused AttnRes mix + RMSNorm (K3_ATTN_RES_NORM_FUSED=1, the default): every GPU test, then the
#      K3 slice's GPU = CPU checks and decode timings at T = 4K with it and without it;
#   6. envcmp: the K3 slice's decode timings at B = 1 / 64, T = 4K under each setting of ENVS (e.g.
#      ENVS="K3_PDL=0 K3_PDL=1,K3_X=2"; a comma joins the settings of one run), one after the other in the
#      same call (ENV_BUDGET s each, 30); ENVCHECK=1 adds the GPU = CPU checks, ENVCMP31=1 the K3.1 slice;
#      ENVS_CHECK: settings run first with the K3 slice's GPU = CPU checks only;
#      tests_env: the *Gpu* tests again under each setting of TEST_ENVS; ops: OPS_ENV="K3_X=1 ..." (and OPS_TIMEOUT s, 15) for the
#      test-ops runs; moe: bench_moe MOE_MODE (decode: checks against fp64, timings of every decode variant; prefill: the
#      prefill kernels' checks and timings); moe_old: bench_moe and bench_moe_old (bench/moe_cuda/build.sh run in a
#      checkout of OLD_COMMIT, copied to BUILD/bench/bench_moe_old) d0 timings, twice, alternating; dsa: bench_dsa (checks, then indexer / top-k / sparse MLA timings;
#      DSA_ENVS="K3_X=1 ..." runs it again under each setting); mla_bench: bench_mla_decode (checks against fp64,
#      then every decode kernel's timings; MLA_ENVS="K3_X=1,K3_MLA_BENCH_ONLY=b64 ..." again under each; then
#      the probe builds bench_mla_decode_probeN packed from MLA_PROBES="1 2 3" bench/mla_cuda/build.sh);
#      ncu_mla: Nsight Compute over the heads-as-N MLA decode kernel; ncu_dsa: over the indexer and top-k
#      (NCU_DSA_SRC=1: top-k's source page as csv); ncu_kda: over the KDA prefill's pre-pass
#      and state walk (bench_kda prefill, T = 2048), whole reports in $OUT/validate/ncu_kda_*.txt;
#   7. ncu_step: Nsight Compute over one eager K3 decode step (bench_slice --profile-step) at B = 1 and 64,
#      T = 4K: every kernel's time and DRAM bytes, summed by kernel (scripts/device/ncu_step.py);
#      NCU_STEP_MODEL=k31: the K3.1 slice's step instead.
# Writes $OUT/validate/run.log, tests.log (the whole k3_tests output) and slice.jsonl.
#   here:   bash scripts/device/validate.sh --pack BUILD   (BUILD/{tests/k3_tests,bench_slice,test-ops,
#           bench/bench_kda} + the non-CUDA shared libraries + COMMIT -> .carry/dev/validate)
#   device: bash scripts/device/validate.sh          (STEPS="tests slice31" for a short call)
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here"
B=$here/.carry/dev/validate
if [ "${1:-}" = "--pack" ]; then  # runs HERE
  build=${2:?build dir}
  rm -rf "$B" && mkdir -p "$B/lib" /tmp/validate_pack && rm -rf /tmp/validate_pack/*
  for f in tests/k3_tests bench_slice test-ops bench/bench_kda bench/bench_moe; do  # bench_moe: moe/build.sh
    cp "$build/$f" /tmp/validate_pack/ && strip -s "/tmp/validate_pack/$(basename "$f")"
  done
  [ -f "$build/bench_slice_old" ] && cp "$build/bench_slice_old" /tmp/validate_pack/ && strip -s /tmp/validate_pack/bench_slice_old
  for f in "$build"/bench/bench_dsa* "$build"/bench/bench_kda_* "$build"/bench/bench_moe_probe* "$build"/bench/bench_moe_old "$build"/bench/bench_mla_decode*; do  # dsa_cuda/build.sh; MOE_PROBES="1 2 3" moe_cuda/build.sh; mla_cuda/build.sh
    [ -f "$f" ] && cp "$f" /tmp/validate_pack/ && strip -s "/tmp/validate_pack/$(basename "$f")"
  done
  ldd /tmp/validate_pack/* 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcublas|libcudart|libpthread|libdl|librt' |
    xargs -r -I{} cp -L {} "$B/lib/"
  (cd /tmp/validate_pack && tar cJf "$B/bin.tar.xz" .)
  git rev-parse --short HEAD >"$B/COMMIT"
  [ -n "${OLD_COMMIT:-}" ] && echo "$OLD_COMMIT" >"$B/COMMIT_old"  # what bench_dsa_old's kernels are
  du -sh "$B"
  exit 0
fi
out=${OUT:-/tmp/validate_out}/validate
mkdir -p "$out"
(cd "$B" && tar xJf bin.tar.xz)
export LD_LIBRARY_PATH="$B/lib:${LD_LIBRARY_PATH:-}"
cuda_libs=$(dirname "$(find /usr/local/cuda*/ -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="${cuda_libs:-/usr/local/cuda/lib64}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
S=/dev/shm/k3val
trap 'rm -rf "$S"' EXIT
trap 'rm -rf "$S"; exit 124' TERM INT
t0=$SECONDS
el() { echo "t=$((SECONDS - t0)) s"; }
STEPS=${STEPS:-tests kda ops slice mla}  # any of: tests tests_env kda ncu_kda ops dsa ncu_dsa mla_bench ncu_mla moe moe_old slice31 slice slice_old mla fused envcmp ncu_step
on() { [[ " $STEPS " == *" $1 "* ]]; }
# bench_envs NAME BIN BUDGET SETTINGS CHECKS METRICS: $B/BIN again under each of SETTINGS (a comma joins one
# run's settings), appending to $out/NAME_cuda.jsonl (commit tagged +setting), each log $out/NAME_envI.log;
# prints its lines matching CHECKS and its metrics matching METRICS.
bench_envs() {
  local name=$1 bin=$2 budget=$3 settings=$4 checks=$5 metrics=$6 i=0 e
  for e in $settings; do
    i=$((i + 1))
    echo "== $bin, $e ($(el))"
    env ${e//,/ } timeout "$budget" "$B/$bin" "$out/${name}_cuda.jsonl" "$(cat "$B/COMMIT" 2>/dev/null)+$e" \
      >"$out/${name}_env$i.log" 2>&1
    echo "rc=$?"
    grep -E "$checks" "$out/${name}_env$i.log" | cut -c1-160
    grep -E '"metric"' "$out/${name}_env$i.log" | grep -E "$metrics" |
      sed -E 's/.*"metric": "([^"]*)", "value": ([^,]*),.*"ratio": ([^,]*),.*"met": ([a-z]*).*/\1 \2 ratio=\3 met=\4/'
  done
}
{
  echo "commit $(cat "$B/COMMIT" 2>/dev/null), steps: ${STEPS}"
  if on tests; then
    echo "== k3_tests *Gpu* ($(el))"
    timeout 60 "$B/k3_tests" --gtest_filter='*Gpu*' >"$out/tests.log" 2>&1
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|actual|assert' "$out/tests.log" | tail -30  # all: tests.log
  fi
  if on tests_env; then  # the GPU tests again under each setting of TEST_ENVS (a comma joins one run's settings)
    i=0
    for e in ${TEST_ENVS:-}; do
      i=$((i + 1))
      echo "== k3_tests *Gpu*, $e ($(el))"
      env ${e//,/ } timeout 60 "$B/k3_tests" --gtest_filter='*Gpu*' >"$out/tests_env$i.log" 2>&1
      grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|actual|assert' "$out/tests_env$i.log" | tail -30
    done
  fi
  if on kda; then
    echo "== bench_kda quick, defaults ($(el))"
    timeout 25 "$B/bench_kda" "$out/kda_bench_kda.json" quick 2>&1 | grep -v conv_mismatch
    for f in "$B"/bench_kda_*; do  # build variants (KDA_FLAGS / KDA_NAME in bench/kda_cuda/build.sh), same run
      [ -x "$f" ] || continue
      echo "== $(basename "$f") quick ($(el))"
      timeout 25 "$f" "$out/kda_$(basename "$f").json" quick 2>&1 | grep -v conv_mismatch
    done  # here: python3 bench/kda_cuda/report.py kda_X.json /dev/null COMMIT MACHINE X >> bench/results/kda_cuda.jsonl
  fi
  if on ops; then
    for op in ${OPS:-mla_decode mla_decode_wgmma moe_route moe_experts dsa_topk}; do
      echo "== test-ops $op (cuda) ($(el))"
      env ${OPS_ENV:-K3_NONE=1} timeout "${OPS_TIMEOUT:-15}" "$B/test-ops" test -o "$op" -b cuda -v 2>&1 | tail -${OPS_TAIL:-4}
    done
  fi
  if on dsa; then  # bench_dsa: its checks against fp64 / the reference top-k, then the graph timings; then
    for v in "" _old; do  # bench_dsa_old (if packed): the same bench built on older kernels, same run
      [ -x "$B/bench_dsa$v" ] || continue
      echo "== bench_dsa$v ($(el))"
      timeout "${DSA_BUDGET:-100}" "$B/bench_dsa$v" "$out/dsa_cuda$v.jsonl" "$(cat "$B/COMMIT$v" 2>/dev/null)" \
        >"$out/dsa$v.log" 2>&1
      echo "rc=$?"
      grep -E "check|OK|FAIL|copy" "$out/dsa$v.log" | cut -c1-160
      grep -E '"metric"' "$out/dsa$v.log" |
        sed -E 's/.*"metric": "([^"]*)", "value": ([^,]*),.*"ratio": ([^,]*),.*"met": ([a-z]*).*/\1 \2 ratio=\3 met=\4/'
    done
    bench_envs dsa bench_dsa "${DSA_BUDGET:-100}" "${DSA_ENVS:-}" "check|OK|FAIL" 'mla|topk_mla'
  fi
  if on ncu_dsa && command -v ncu >/dev/null; then  # the indexer and top-k kernels (bench_dsa profile)
    echo "== ncu bench_dsa profile ($(el))"
    timeout "${NCU_BUDGET:-150}" ncu --kernel-name regex:'index_kernel|topk_kernel' --clock-control none \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
      --section SchedulerStats --section MemoryWorkloadAnalysis --print-details all \
      "$B/bench_dsa" /dev/null x profile >"$out/ncu_dsa.txt" 2>&1
    echo "rc=$?"
    grep -E 'index_kernel|topk_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|No Eligible' \
      "$out/ncu_dsa.txt" | cut -c1-150 | head -90
    # top-k's source page (csv) of the cluster kernel's launches NCU_DSA_SKIPS (0 1: b1 x 8K, 2 3: b64 x 8K,
    # 4 5: b1 x 128K; b64 x 128K runs the sample kernel, which the regex leaves out)
    if [ -n "${NCU_DSA_SRC:-}" ]; then
      for sk in ${NCU_DSA_SKIPS:-0 4}; do
        timeout "${NCU_BUDGET:-60}" ncu --kernel-name regex:topk_kernel --launch-skip $sk --launch-count 1 \
          --clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats \
          --import-source yes -f -o "$out/ncu_src_topk$sk" "$B/bench_dsa" /dev/null x profile >/dev/null 2>&1
        timeout 60 ncu -i "$out/ncu_src_topk$sk.ncu-rep" --page source --csv --print-source sass \
          >"$out/ncu_sass_topk$sk.csv" 2>&1
        echo "top-k source page (launch $sk) rc=$? ($(wc -l <"$out/ncu_sass_topk$sk.csv") lines)"
        rm -f "$out/ncu_src_topk$sk.ncu-rep"
      done
    fi
  fi
  if on mla_bench; then  # bench_mla_decode: its checks against fp64, then every decode kernel's timings
    echo "== bench_mla_decode ($(el))"
    timeout "${MLA_BUDGET:-150}" "$B/bench_mla_decode" "$out/mla_cuda.jsonl" "$(cat "$B/COMMIT" 2>/dev/null)" \
      >"$out/mla.log" 2>&1
    echo "rc=$?"
    grep -E "check|OK|FAIL|device" "$out/mla.log" | cut -c1-160
    grep -E '"metric"' "$out/mla.log" |
      sed -E 's/.*"metric": "([^"]*)", "value": ([^,]*),.*"ratio": ([^,]*),.*"met": ([a-z]*).*/\1 \2 ratio=\3 met=\4/'
    bench_envs mla bench_mla_decode "${MLA_BUDGET:-150}" "${MLA_ENVS:-}" "FAIL|all checks" '_us"'
    for f in "$B"/bench_mla_decode_probe*; do  # MLA_PROBES builds (results wrong by design): b64 x 32K only
      [ -x "$f" ] || continue
      echo "== $(basename "$f"), b64 ($(el))"
      K3_MLA_BENCH_ONLY=b64 timeout "${MLA_BUDGET:-150}" "$f" "$out/mla_cuda.jsonl" \
        "$(cat "$B/COMMIT" 2>/dev/null)+$(basename "$f")" 2>&1 | grep -E '"metric"' | grep -E '_us"' |
        sed -E 's/.*"metric": "([^"]*)", "value": ([^,]*),.*/\1 \2/'
    done
  fi
  if on ncu_kda && command -v ncu >/dev/null; then  # the KDA prefill's two kernels, each on its third launch
    for k in kda_intra_kernel kda_state_kernel; do  # (bench_kda prefill: T = 2048 first, 32 chunks x 96 heads)
      echo "== ncu $k ($(el))"
      timeout "${NCU_BUDGET:-60}" ncu --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --clock-control none \
        --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section InstructionStats --section SourceCounters --print-details all \
        "$B/${NCU_KDA_BIN:-bench_kda}" /dev/null prefill >"$out/ncu_$k.txt" 2>&1
      echo "rc=$?"
      grep -E 'Duration|DRAM Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|No Eligible|Issued Ipc|Executed Instructions  ' \
        "$out/ncu_$k.txt" | cut -c1-150 | head -40
      if [ -n "${NCU_KDA_SRC:-}" ]; then  # per-SASS-instruction counts and stall samples (the source page, csv)
        timeout "${NCU_BUDGET:-60}" ncu --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --clock-control none \
          --section SourceCounters --section InstructionStats --import-source yes -f -o "$out/ncu_src_$k" \
          "$B/${NCU_KDA_BIN:-bench_kda}" /dev/null prefill >/dev/null 2>&1
        timeout 60 ncu -i "$out/ncu_src_$k.ncu-rep" --page source --csv --print-source sass >"$out/ncu_sass_$k.csv" 2>&1
        echo "source page rc=$? ($(wc -l <"$out/ncu_sass_$k.csv") lines)"
        rm -f "$out/ncu_src_$k.ncu-rep"
      fi
    done
  fi
  if on ncu_mla && command -v ncu >/dev/null; then  # the heads-as-N MLA decode kernel at b64 x 32K
    echo "== ncu bench_mla_decode b64 ($(el))"
    K3_MLA_BENCH_ONLY=b64 timeout "${NCU_BUDGET:-150}" ncu --kernel-name regex:'mla_split_wgmma_hn' \
      --launch-skip 5 --launch-count 1 --clock-control none \
      --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --print-details all "$B/bench_mla_decode" /dev/null x >"$out/ncu_mla.txt" 2>&1
    echo "rc=$?"
    grep -E 'mla_split|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|No Eligible|Tensor|Pipe' \
      "$out/ncu_mla.txt" | cut -c1-150 | head -60
  fi
  if on moe; then  # bench_moe decode: its checks against fp64 (every variant), then the decode timings
    echo "== bench_moe ${MOE_MODE:-decode} ($(el))"
    timeout "${MOE_BUDGET:-150}" "$B/bench_moe" "$out/moe_cuda.jsonl" "$(cat "$B/COMMIT" 2>/dev/null)" "${MOE_MODE:-decode}" 2>&1 |
      grep -E "check|decode_b|prefill_n|PASS|FAIL|copy|TFLOP" | cut -c1-200
  fi
  if on moe_old && [ -x "$B/bench_moe_old" ]; then  # bench_moe built at OLD_COMMIT: d0 timings, alternating
    for i in 1 2; do
      for v in bench_moe bench_moe_old; do
        echo "== $v d0, round $i ($(el))"
        c=$(cat "$B/COMMIT" 2>/dev/null)
        [ "$v" = bench_moe_old ] && c=$(cat "$B/COMMIT_old" 2>/dev/null || echo old)
        timeout 60 "$B/$v" "$out/moe_cuda.jsonl" "$c" d0 2>&1 | grep -E "decode_b|copy|FAIL" | cut -c1-120
      done
    done
  fi
  if on slice31 || on slice || on slice_old || on mla || on fused || on envcmp || on ncu_step; then
    rm -rf "$S" && mkdir -p "$S"
    echo "== K3 slice ($(el))"
    timeout 50 python3 scripts/make_k3_slice.py --out "$S/k3" --jobs "$(nproc)" 2>&1 | tail -1
    timeout 20 python3 scripts/make_k3_slice.py --out "$S/k31" --dsa --like "$S/k3" 2>&1 | tail -1
  fi
  if on slice31; then  # DSA's sparse steps (top-2048 of 4K): ops/mla_sparse.h in the model
    echo "== bench_slice, defaults, K3.1 decode B=1 T=4K ($(el))"
    timeout 45 "$B/bench_slice" -m "$S/k31" --no-check --batches 1 --contexts "${SLICE31_CTX:-4096}" --budget-s 30 \
      --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)" 2>&1 | grep -E 'B=|graphs'
  fi
  if on slice; then
    echo "== bench_slice, defaults, K3 and K3.1 ($(el))"
    timeout "${SLICE_TIMEOUT:-90}" "$B/bench_slice" -m "$S/k3" -m31 "$S/k31" --batches "${SLICE_BATCHES:-1,64}" \
      --contexts "${SLICE_CTX:-4096,131072}" --budget-s "${SLICE_BUDGET:-70}" \
      --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)" 2>&1 | grep -E 'NMSE|over|B=|graphs'
  fi
  if on slice_old && [ -x "$B/bench_slice_old" ]; then  # the same slices on an earlier commit's bench_slice
    echo "== bench_slice_old ($(cat "$B/COMMIT_old" 2>/dev/null)), K3 and K3.1 ($(el))"
    timeout "${SLICE_TIMEOUT:-90}" "$B/bench_slice_old" -m "$S/k3" -m31 "$S/k31" --no-check \
      --batches "${SLICE_BATCHES:-1,64}" --contexts "${SLICE_CTX:-4096,131072}" --budget-s "${SLICE_BUDGET:-70}" \
      --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT_old" 2>/dev/null)" 2>&1 |
      grep -E 'over|B=|graphs'
  fi
  if on mla; then
    echo "== bench_slice, K3_MLA_FAST=0, K3 decode ($(el))"
    K3_MLA_FAST=0 timeout 50 "$B/bench_slice" -m "$S/k3" --no-check --batches 1,64 --contexts 4096,131072 \
      --budget-s 40 --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)+K3_MLA_FAST=0" 2>&1 |
      grep -E 'B=|graphs'
  fi
  if on fused; then
    echo "== k3_tests *Gpu*, K3_ATTN_RES_NORM_FUSED=1 ($(el))"
    K3_ATTN_RES_NORM_FUSED=1 timeout 60 "$B/k3_tests" --gtest_filter='*Gpu*' >"$out/tests_fused.log" 2>&1
    grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|actual|assert' "$out/tests_fused.log" | tail -30
    for f in 0 1; do
      echo "== bench_slice K3 B=1,64 T=4K, K3_ATTN_RES_NORM_FUSED=$f ($(el))"
      K3_ATTN_RES_NORM_FUSED=$f timeout 60 "$B/bench_slice" -m "$S/k3" --batches 1,64 --contexts 4096 \
        --budget-s 40 --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)+K3_ATTN_RES_NORM_FUSED=$f" \
        2>&1 | grep -E 'NMSE|over|B=|graphs'
    done
  fi
  if on envcmp; then
    for e in ${ENVS_CHECK:-}; do  # GPU = CPU checks only (K3, B = 1), under each setting of ENVS_CHECK
      echo "== bench_slice K3 checks, $e ($(el))"
      env ${e//,/ } timeout 70 "$B/bench_slice" -m "$S/k3" --batches 1 --contexts 4096 --budget-s 40 \
        --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)+$e" 2>&1 | grep -E 'NMSE|over|B='
    done
    for e in ${ENVS:-}; do
      echo "== bench_slice K3 B=1,64 T=4K, $e ($(el))"
      env ${e//,/ } timeout $((${ENV_BUDGET:-30} + 30)) "$B/bench_slice" -m "$S/k3" ${ENVCMP31:+-m31 "$S/k31"} \
        $([ -n "${ENVCHECK:-}" ] || echo --no-check) --batches 1,64 --contexts 4096 \
        --budget-s "${ENV_BUDGET:-30}" --jsonl "$out/slice.jsonl" --commit "$(cat "$B/COMMIT" 2>/dev/null)+$e" 2>&1 |
        grep -E 'NMSE|over|B=|graphs'
    done
  fi
  if on ncu_step && command -v ncu >/dev/null; then
    for b in ${NCU_BATCHES:-1 64}; do
      echo "== ncu over one eager ${NCU_STEP_MODEL:-k3} decode step, B=$b T=4K ($(el))"
      timeout 150 ncu --profile-from-start off --clock-control none --csv --page raw --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
        "$B/bench_slice" -m "$S/${NCU_STEP_MODEL:-k3}" --no-check --batches "$b" --contexts 4096 --steps 2 --profile-step \
        --budget-s 100 >"$out/ncu_step_b$b.csv" 2>&1
      echo "rc=$?"
      grep -E 'B=' "$out/ncu_step_b$b.csv" | cut -c1-400
      python3 scripts/device/ncu_step.py "$out/ncu_step_b$b.csv" --each >"$out/ncu_step_b$b.txt" 2>&1
      head -40 "$out/ncu_step_b$b.txt"
    done
  fi
  echo "== done ($(el))"
} >"$out/run.log" 2>&1
tail -c 2500 "$out/run.log"
