#!/usr/bin/env bash
# run_device.sh: one command on the GPU machine: (tokenize) -> train for a fixed budget -> held-out
# perplexity -> export to $OUT -> summary. Run from the repo root, e.g. through the device tool:
#   command: bash training/run_device.sh          carry: [".carry/data", ".carry/tokenizer"]
# Inputs (carried, git-ignored): .carry/data/{train,val}.npy + meta.json (training/tokenize_corpus.py) and
# .carry/tokenizer/{tiktoken.model,tokenizer_config.json} (tools/train_bpe.py). If .carry/data is absent but
# .carry/corpus/*.jsonl was carried instead, it tokenizes first (tiktoken + regex are on the device image).
# Paths: DATA, TOK, CORPUS (defaults .carry/data, .carry/tokenizer, .carry/corpus).
# Environment knobs: MINUTES (training budget, default 7.5 so the whole call fits the 10-minute command
# limit), K31=1 (after K3: staged K3.1, k31_stages.py; K31_INDEXER_MIN, K31_SPARSE_MIN minutes),
# DSA=1 (K3.1 from scratch, superseded), BATCH (default 32), SEQ (1024), LR (3e-3), EXTRA (more train.py flags).
# $OUT gets: model/config.json, model/model.safetensors.index.json, model/model-0000i-of-0000n.safetensors
# (<= 15 MiB of data each: the device hands back at most 8 files of 16 MiB, 64 MiB in all), summary.json
# and with K31=1 k31-delta.safetensors (the K3.1 config in its metadata): 7 files for a 3-shard K3, so one
# more (a log) still comes back; the hand-back limit is 8 files.
# The tokenizer files are not copied back (they are already in .carry/tokenizer here); see docs/training.md.
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/k3-train-out}
MINUTES=${MINUTES:-7.5}
BATCH=${BATCH:-32}
SEQ=${SEQ:-1024}
LR=${LR:-3e-3}
DATA=${DATA:-.carry/data}
TOK=${TOK:-.carry/tokenizer}
CORPUS=${CORPUS:-.carry/corpus}
PY=${PYTHON:-python3}

$PY - <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
EOF
if [ ! -f "$DATA/train.npy" ]; then
  echo "== tokenizing $CORPUS"
  $PY training/tokenize_corpus.py --corpus "$CORPUS" --tokenizer "$TOK" --out "$DATA"
fi
mkdir -p "$OUT"
flags=(--data "$DATA" --tokenizer "$TOK" --out "$OUT" --minutes "$MINUTES" --batch "$BATCH" --seq "$SEQ" --lr "$LR")
if [ "${DSA:-0}" = "1" ]; then flags+=(--dsa); fi
if [ "${K31:-0}" = "1" ]; then
  flags+=(--k31 --k31-indexer-minutes "${K31_INDEXER_MIN:-0.75}" --k31-sparse-minutes "${K31_SPARSE_MIN:-1.0}")
fi
echo "== training: ${flags[*]} ${EXTRA:-}"
# shellcheck disable=SC2086
$PY training/train.py "${flags[@]}" ${EXTRA:-}
echo "== files in \$OUT"
find "$OUT" -type f -printf '%p %s\n'
