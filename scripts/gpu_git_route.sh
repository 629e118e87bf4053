#!/usr/bin/env bash
# The git route on the GPU machine (docs/gpu.md), run by gpu_check.sh where git is there and carry/
# was carried (`buildllm carry` at home; the device tool's carry: carry, wheelhouse, ...): DVC from
# the wheelhouse where this Python lacks it, a clone of carry/project.git, the corpus and token files
# pulled from carry/dvc-store, one `dvc exp run -S device=cuda` (no stage whose data is missing runs),
# and the experiment home in one file, $OUT/exps.bundle; the steps' output in $OUT/git_route.log.
# At home: git fetch OUT/exps.bundle 'refs/exps/*:refs/exps/*', then dvc exp show / buildllm compare.
# Usage: gpu_git_route.sh PYTHON OUT; the run is cut after GPU_GIT_ROUTE_S (default 150) seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$1" OUT="$(mkdir -p "$2" && cd "$2" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
exec >"$OUT/git_route.log" 2>&1
set -x
"$PY" -c 'import dvc' 2>/dev/null || "$PY" -m pip install -q --no-index --find-links "$ROOT/wheelhouse" dvc
git clone -q "$ROOT/carry/project.git" "$WORK/project"
cd "$WORK/project"
mkdir -p "$WORK/bin" && printf '#!/bin/sh\nexec "%s" "$@"\n' "$PY" >"$WORK/bin/python"  # the stages' `python`
chmod +x "$WORK/bin/python"
export PATH="$WORK/bin:$PATH" PYTHONPATH="$WORK/project" DVC_NO_ANALYTICS=1
"$PY" -m dvc remote add --local carry "$ROOT/carry/dvc-store"
"$PY" -m dvc pull -q -r carry corpus tokenize
DEVICE="${GPU_CHECK_DEVICE:-cuda}"  # cpu: the stand-in's rehearsal
timeout "${GPU_GIT_ROUTE_S:-150}" "$PY" -m dvc exp run -n "$DEVICE-git-it1-fp32" -S device="$DEVICE" -S precision=fp32 \
  -S train.batch_size=16 -S train.compile=false -S tune.seconds=20 benchmark estimate
git bundle create "$OUT/exps.bundle" $(git for-each-ref --format='%(refname)' refs/exps | grep -v /exec/) ^HEAD
