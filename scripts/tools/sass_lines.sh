#!/usr/bin/env bash
# scripts/tools/sass_lines.sh FILE.cu [NVCC FLAGS...]: the SASS (sm_90a) of one CUDA source, as static
# instruction counts by source line and opcode (where the instructions of a kernel come from), and the whole
# opcode histogram. The disassemblers come from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm), fetched
# once into .whl/sass (git-ignored); nvcc alone ships neither here.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
src=${1:?usage: sass_lines.sh FILE.cu [NVCC FLAGS...]}
shift
bin=$here/.whl/sass/nvidia/cu13/bin
if [ ! -x "$bin/nvdisasm" ]; then
  mkdir -p "$here/.whl/sass"
  python3 -m pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$here/.whl/sass"
  for w in "$here"/.whl/sass/*.whl; do python3 -m zipfile -e "$w" "$here/.whl/sass"; done
  chmod +x "$bin"/*
fi
cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
nvcc -cubin -arch=sm_90a -lineinfo -std=c++20 --expt-relaxed-constexpr -I"$here/src" -I"$here/include" "$@" \
  -o "$cubin" "$src"
"$bin/nvdisasm" -gi -c "$cubin" | python3 -c '
import collections, re, sys
line, by_line, ops, total = None, collections.Counter(), collections.defaultdict(collections.Counter), collections.Counter()
for l in sys.stdin:
    m = re.search(r"//## File \"([^\"]+)\", line (\d+)", l)
    if m:
        line = "%s:%s" % (m.group(1).split("/")[-1], m.group(2))
        continue
    m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?U?P[0-9T] )?([A-Z0-9_]+)", l)
    if m:
        by_line[line] += 1; ops[line][m.group(2)] += 1; total[m.group(2)] += 1
print("static SASS instructions: %d" % sum(total.values()))
print("by opcode:", " ".join("%s %d" % kv for kv in total.most_common(16)))
for k, v in by_line.most_common(25):
    print("%6d  %-40s %s" % (v, k, " ".join("%s %d" % kv for kv in ops[k].most_common(6))))
'
