#!/usr/bin/env bash
# scripts/build.sh [DIR] [cmake args...]: configure (once) and build with ninja.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build}; shift || true
cmake -S "$here" -B "$dir" -G Ninja "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)"
