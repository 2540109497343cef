#!/usr/bin/env bash
# bench/dsa_cuda/build.sh [OUT_DIR]: builds bench_dsa (the DSA kernels, their references, ops/mla_decode*
# for the sparse MLA, and the bench driver) with nvcc for sm_90a, standalone (no CMake), one object per
# source rebuilt only when the source is newer; default OUT_DIR = build-dsa/bench. DSA_FLAGS: extra nvcc flags
# (a build variant, objects kept apart), DSA_NAME: the binary's name (bench_dsa; validate.sh runs bench_dsa_old
# beside the default, e.g. DSA_NAME=bench_dsa_old DSA_FLAGS=-DSOME_SWITCH=0).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$here/build-dsa/bench}
name=${DSA_NAME:-bench_dsa}
obj=$out/obj${DSA_FLAGS:+_$name}
mkdir -p "$obj"
srcs=("$here/bench/dsa_cuda/bench_dsa.cu" "$here"/src/ops/dsa_*.cu "$here"/src/ops/dsa_*.cpp "$here"/src/ops/mla_sparse_*.c*
      "$here"/src/ops/mla_decode*.cu "$here/src/ops/mla_decode_ref.cpp" "$here/src/core/dtype.cpp"
      "$here/src/core/env.cpp" "$here/src/core/log.cpp")
objs=()
# the newest header any object may include: an object older than it is rebuilt
newest_hdr=$(ls -t "$here"/src/ops/*.h "$here"/src/ops/*.cuh "$here"/src/core/*.h "$here"/bench/*.cuh | head -1)
for s in "${srcs[@]}"; do
  o="$obj/$(basename "$s").o"
  objs+=("$o")
  if [ ! -e "$o" ] || [ "$s" -nt "$o" ] || [ "$newest_hdr" -nt "$o" ]; then
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr ${DSA_FLAGS:-} \
      -I"$here/src" -I"$here/include" -x cu -c "$s" -o "$o" 2>&1 | grep -E "error|warning" || true
    test -e "$o" || { echo "compile failed: $s"; exit 1; }
  fi
done
nvcc -gencode=arch=compute_90a,code=sm_90a -o "$out/$name" "${objs[@]}" -lcuda
test -x "$out/$name"
echo "built $out/$name"
