#!/usr/bin/env bash
# Where an AMX call's time goes (split.py's docstring): the probes applied in a scratch worktree
# of HEAD, the linears timed on the first core, and the tile unit's own rate (tmul.c).
#   bash docs/bench/qwen-pair/amx/probe/run.sh > docs/bench/qwen-pair/amx/probe/split.md
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
tree=$(mktemp -d)
git -C "$root" worktree add -q --detach "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
git -C "$tree" apply "$here/probes.patch"
(cd "$tree" && PYTHONPATH="$tree" taskset -c 0 "${PYTHON:-python}" "$here/split.py" \
    16,150,256 base,NO_TILES,NO_FOLD,NO_MIN,NO_UNPACK,TILES_ONLY,TILES_ONLY+HOT)
gcc -O2 -mamx-tile -mamx-int8 "$here/tmul.c" -o "$tree/tmul"
taskset -c 0 "$tree/tmul"
