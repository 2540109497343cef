#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets with clang and runs each for SECONDS (default 300).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-300}
CC=clang CXX=clang++ bash "$here/scripts/build.sh" "$here/build-fuzz" -DK3_FUZZ=ON -DK3_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
shopt -s nullglob
for bin in "$here"/build-fuzz/fuzz/fuzz_*; do
  [ -x "$bin" ] || continue
  name=$(basename "$bin")
  corpus="$here/build-fuzz/corpus-$name"; mkdir -p "$corpus"
  seeds="$here/fuzz/seeds/${name#fuzz_}"
  echo "fuzz: $name for ${secs}s"
  "$bin" -max_total_time="$secs" -print_final_stats=0 -rss_limit_mb=4096 "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) \
    2>&1 | tail -n 3
done
