#!/usr/bin/env bash
# The main job on a fresh machine: install, build, and run the embedded default model.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/install-deps.sh"
bash "$here/scripts/build.sh" "$here/build" -DK3_TESTS=OFF
k3="$here/build/k3"
model="$here/models/tiny-k3"
"$k3" info -m "$model"
echo "--- tokenizer round trip"
ids=$("$k3" tokenize -m "$model" -p "Hello, world! 你好，世界。 It's 2026.")
echo "ids: $ids"
"$k3" detokenize -m "$model" --ids "$ids"
