#!/usr/bin/env bash
# The main job on a fresh machine: install, build, and run the embedded default model (models/k3-tiny,
# a small K3 trained by training/): model summary, a tokenizer round trip, and a greedy continuation.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/install-deps.sh"
bash "$here/scripts/build.sh" "$here/build" -DK3_TESTS=OFF
k3="$here/build/k3"
model="$here/models/k3-tiny"
"$k3" info -m "$model"
echo "--- tokenizer round trip"
ids=$("$k3" tokenize -m "$model" -p "Hello, world! It's 2026.")
echo "ids: $ids"
"$k3" detokenize -m "$model" --ids "$ids"
echo
echo "--- k3 run"
"$k3" run -m "$model" -p "It was a bright morning when" -n 80 --temp 0
echo
