#!/usr/bin/env bash
# scripts/device-restore.sh: put back what scripts/device-aside.sh moved out. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
aside=/tmp/k3-models-aside
for m in k3-tiny k3.1-tiny; do
  if [ -d "$aside/$m" ] && [ ! -e "$here/models/$m" ]; then mv "$aside/$m" "$here/models/$m"; fi
done
git -C "$here" ls-files -z -- models/k3-tiny models/k3.1-tiny | xargs -0 -r git -C "$here" update-index --no-skip-worktree
