#!/usr/bin/env bash
# assemble.sh: turn what run_device.sh handed back into a complete model directory.
#   bash training/assemble.sh FILES_AT DEST      (FILES_AT: the folder holding model/ and summary.json)
# Copies FILES_AT/model/* (config.json, index, shards) and FILES_AT/summary.json to DEST, adds the tokenizer
# the model was trained with (.carry/tokenizer/tiktoken.model, tokenizer_config.json), and checks that every
# shard named by the index is present.
set -euo pipefail
src=${1:?usage: assemble.sh FILES_AT DEST}
dst=${2:?usage: assemble.sh FILES_AT DEST}
mkdir -p "$dst"
cp "$src"/model/* "$dst"/
cp "$src"/summary.json "$dst"/training_summary.json
cp .carry/tokenizer/tiktoken.model .carry/tokenizer/tokenizer_config.json "$dst"/
python3 - "$dst" <<'PY'
import json, os, sys
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
missing = sorted({f for f in index["weight_map"].values() if not os.path.exists(os.path.join(d, f))})
if missing:
    sys.exit(f"missing shards: {missing}")
print(f"{d}: {len(index['weight_map'])} tensors in {len(set(index['weight_map'].values()))} shards, tokenizer added")
PY
