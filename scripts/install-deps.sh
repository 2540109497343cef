#!/usr/bin/env bash
# Installs everything k3.cpp needs to build and test, by package name. Safe to run twice.
set -euo pipefail
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

APT_PACKAGES=(build-essential cmake ninja-build pkg-config git
  libpcre2-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

PY=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
if ! $PY -c "import numpy, safetensors, tiktoken, pytest, regex, ml_dtypes, openai" 2>/dev/null; then
  echo "install-deps: pip install -r requirements-test.txt"
  $PY -m pip install -q -r "$here/requirements-test.txt"
fi
