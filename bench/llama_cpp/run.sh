#!/usr/bin/env bash
# bench/llama_cpp/run.sh: k3 side by side with llama.cpp on the same random-weight width checkpoints.
#
#   bench/llama_cpp/run.sh [kl|k3]...          (default: kl k3)
#
# 1. A venv ($LLAMA_VENV, default /tmp/k3-llama-venv) with PyPI llama-cpp-python built for the CPU only
#    (CMAKE_ARGS below, 2 jobs: about an hour on the 2-core dev VM), and the converter's needs: gguf,
#    torch, transformers (the converter imports both even for a plain bf16 copy).
# 2. The llama.cpp sources that sdist vendors ($LLAMA_SRC), for convert_hf_to_gguf.py.
# 3. The checkpoints (scripts/make_width_checkpoints.py, 4 layers, 16 experts, top 2, bf16) in
#    $WIDTH_DIR (default /tmp/k3-width), converted to bf16 GGUF by bench/llama_cpp/convert.py.
# 4. bench/llama_cpp/side_by_side.py: k3 bench and llama.cpp (run_llama.py) prefill / decode tokens/s with
#    2 threads, logits of both on the same ids (NMSE), JSON lines into bench/results/llama_cpp.jsonl.
# Env: K3_BIN (default build/k3), PP / TG / REPS (default 64 / 8 / 2; REPS = interleaved rounds of one k3
# and one llama.cpp run each, medians reported), LLAMA_CPP_PYTHON (version).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
venv=${LLAMA_VENV:-/tmp/k3-llama-venv}
ver=${LLAMA_CPP_PYTHON:-0.3.36}
src=${LLAMA_SRC:-/tmp/k3-llama-src}
width=${WIDTH_DIR:-/tmp/k3-width}
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(kl k3)

if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
py="$venv/bin/python"
"$py" -c "import numpy, gguf, torch, transformers" 2>/dev/null ||
  "$py" -m pip install -q numpy gguf torch transformers
if ! "$py" -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 "$py" -m pip install --no-binary llama-cpp-python "llama-cpp-python==$ver"
fi
if [ ! -f "$src/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  mkdir -p "$src.dl"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$src.dl" "llama-cpp-python==$ver"
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$src.dl"/llama_cpp_python-"$ver".tar.gz -C "$src" --strip-components=1
fi

mkdir -p "$width"
for f in "${families[@]}"; do
  name=$([ "$f" = kl ] && echo kl48-w4 || echo k3-w4)
  [ -f "$width/$name/model.safetensors" ] ||
    python3 "$here/scripts/make_width_checkpoints.py" --family "$f" --out "$width/$name"
  [ -f "$width/$name.gguf" ] ||
    "$py" "$here/bench/llama_cpp/convert.py" "$src/vendor/llama.cpp" "$width/$name" "$width/$name.gguf" \
      --outtype bf16 > "$width/$name.convert.log" 2>&1 || { tail -20 "$width/$name.convert.log"; exit 1; }
  "$py" "$here/bench/llama_cpp/side_by_side.py" --model "$width/$name" --gguf "$width/$name.gguf" \
    --llama-python "$py" --k3 "${K3_BIN:-$here/build/k3}" --pp "${PP:-64}" --tg "${TG:-8}" --reps "${REPS:-2}" \
    --jsonl "$here/bench/results/llama_cpp.jsonl" --peer "llama.cpp (llama-cpp-python $ver, CPU, bf16 GGUF)"
done
