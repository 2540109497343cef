#!/usr/bin/env bash
# scripts/device-aside.sh: before a device-tool call, move the embedded models out of the working tree (the tree
# that travels is limited to 64 MiB; a tracked file missing from the tree does not travel). Undo with
# scripts/device-restore.sh. Idempotent.
set -euo pipefail
if [ -f /tmp/k3-device-notice ] && [ "${K3_DEVICE_OK:-0}" != 1 ]; then cat /tmp/k3-device-notice >&2; exit 3; fi
here=$(cd "$(dirname "$0")/.." && pwd)
aside=/tmp/k3-models-aside
mkdir -p "$aside"
# skip-worktree first, so that a commit made while they are aside (git add -A) cannot record them as deleted
# (session 23's 3bd9e5b did); device-restore.sh clears it
git -C "$here" ls-files -z -- models/k3-tiny models/k3.1-tiny | xargs -0 -r git -C "$here" update-index --skip-worktree
for m in k3-tiny k3.1-tiny; do
  if [ -d "$here/models/$m" ] && [ ! -e "$aside/$m" ]; then mv "$here/models/$m" "$aside/$m"; fi
done
du -sh --exclude=.git --exclude='build*' --exclude=.carry "$here" 2>/dev/null | cut -f1 | sed 's/^/tree without ignored dirs: /'
