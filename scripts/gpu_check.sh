#!/usr/bin/env bash
# GPU check: the route a user takes on a rented GPU machine (docs/gpu.md), on the lent one (one
# H200; torch 2.11, tokenizers, numpy, pandas, pyyaml, ...; no DVC, no corpus package, no network,
# perhaps no git), in ONE call that ends inside the 10 minutes a call may take, within the 15 minutes
# of device time with the machine's start. The device tool's call, from the
# repository root here, once the token files for vocabularies 4096 and 16384 and the wheelhouse
# exist (docs/gpu.md, "1. Prepare what travels"):
#
#   run(command="bash scripts/gpu_check.sh", carry=["data/tokens", "tokenizer", "wheelhouse"], timeout_s=580)
#
# Add "carry" (`buildllm carry`) to take the git route first where that machine has git.
#
# The CUDA tests, DVC from the wheelhouse, then the experiments as `buildllm pack-run` runs, each
# added to $OUT/runs.tar.gz as it ends; 6 files under $OUT in all (scripts/gpu_check.py lists them).
# Budget: GPU_CHECK_BUDGET_S (default 520 s) counted from this script's first line, before any
# Python imports torch. At home: `python scripts/gpu_home.py OUT` (the folder the files came back in).
#
# A rerun of named steps after a miss: GPU_CHECK_STEPS=cuda-it3-bf16,finder-it3 (names in
# results.jsonl), with the same carry and a timeout that fits the device time left.
#
# GPU_CHECK_DEVICE=cpu runs the same route on the CPU with preset tiny: the stand-in that rehearses
# it (tests/measure/test_benchmark_gpu_check.py). Python: $PYTHON, else the GPU machine's
# /opt/torch/.venv/bin/python3, else python3 when its torch sees CUDA, else .venv/bin/python.
export GPU_CHECK_T0="$(date +%s.%N)"  # the budget's clock: before torch is imported
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x /opt/torch/.venv/bin/python3 ]]; then
  PY=/opt/torch/.venv/bin/python3
elif [[ "$DEVICE" == cuda ]] && has_cuda_torch python3; then
  PY=python3
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python3
fi
if [[ "$DEVICE" == cuda ]] && ! has_cuda_torch "$PY"; then
  echo "error: $PY has no CUDA-enabled torch, or sees no GPU; run this on the GPU machine, or set GPU_CHECK_DEVICE=cpu"
  exit 1
fi
# The route (docs/gpu.md): with git here and carry/ carried (`buildllm carry`), one experiment by
# `dvc exp run` first ($OUT/exps.bundle), then the pack-run checks below in the budget left. A rerun
# of named steps (GPU_CHECK_STEPS) takes the archive route alone.
OUT_DIR="${GPU_CHECK_OUT:-${OUT:-$ROOT/gpu_check_out}}"
if command -v git >/dev/null && [[ -d "$ROOT/carry/project.git" && -z "${GPU_CHECK_STEPS:-}" ]]; then
  echo "route: git ($(git --version)): dvc exp run in a clone, then the archive route's checks"
  bash "$ROOT/scripts/gpu_git_route.sh" "$PY" "$OUT_DIR" || echo "git route: failed; see $OUT_DIR/git_route.log"
else
  why="no carry/project.git carried"; command -v git >/dev/null || why="no git here"
  [[ -n "${GPU_CHECK_STEPS:-}" ]] && why="a rerun of named steps"
  echo "route: archive (pack-run): $why"
fi
exec "$PY" "$ROOT/scripts/gpu_check.py"
