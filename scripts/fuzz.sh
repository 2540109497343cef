#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets with clang and runs each for SECONDS (default 300).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-300}
CC=clang CXX=clang++ cmake -S "$here" -B "$here/build-fuzz" -G Ninja -DK3_FUZZ=ON -DK3_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
shopt -s nullglob
# Only the fuzz targets (and the library they link), not the CLI.
targets=()
for src in "$here"/fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
cmake --build "$here/build-fuzz" -j "$(nproc)" --target "${targets[@]}"
for bin in "$here"/build-fuzz/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  corpus="$here/build-fuzz/corpus-$name"; mkdir -p "$corpus"
  seeds="$here/fuzz/seeds/${name#fuzz_}"
  echo "fuzz: $name for ${secs}s"
  "$bin" -max_total_time="$secs" -print_final_stats=0 -rss_limit_mb=4096 "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) \
    2>&1 | tail -n 3
done
