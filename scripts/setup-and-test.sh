#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, build, unit + model tests, Python parity tests,
# the same unit tests under ASan+UBSan, the CUDA sources compiled for sm_90a (when nvcc exists), and
# a short libFuzzer run of each fuzz target.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh
jobs=$(nproc)

echo "=== build (Release)"
bash scripts/build.sh build -DK3_TESTS=ON
echo "=== unit and model tests"
(cd build && ctest --output-on-failure -j "$jobs")
echo "=== python tests"
K3_BIN="$here/build/k3" python3 -m pytest -q tests/python

echo "=== ASan + UBSan"
bash scripts/build.sh build-asan -DK3_TESTS=ON -DK3_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$jobs")

if command -v nvcc >/dev/null 2>&1; then
  echo "=== CUDA sources (sm_90a, compile only)"
  cmake -S . -B build-cuda -G Ninja -DK3_TESTS=OFF -DK3_CUDA=ON -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
  cmake --build build-cuda -j "$jobs" --target k3_cuda
else
  echo "=== CUDA sources: skipped (no nvcc)"
fi

echo "=== fuzzers (short run)"
bash scripts/fuzz.sh 20
echo "setup-and-test: all steps passed"
