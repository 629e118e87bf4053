#!/usr/bin/env bash
# GPU check: the CUDA route measured on a lent GPU (one H200; torch, tokenizers, numpy, pandas, pyyaml,
# psutil, tqdm, matplotlib, pytest; no DVC, no corpus package, no network), in two calls of at most
# 5 minutes each, so that a rerun of one still fits the 15 minutes of device time. The device tool's
# calls, from the repository root here, once `dvc repro tokenize` has made the token files and
# tokenizers for vocabularies 4096 and 16384 (see README, "On a GPU"):
#
#   run(command="GPU_CHECK_PART=1 bash scripts/gpu_check.sh", carry=["data/tokens", "tokenizer"], timeout_s=300)
#   run(command="GPU_CHECK_PART=2 bash scripts/gpu_check.sh", carry=["data/tokens", "tokenizer"], timeout_s=300)
#
# Part 1: environment; the CUDA tests of tests/device/test_cuda.py; bounded benchmarks of iterations
# 1-3 in bf16, fp16 and fp32. Part 2: the batch finder on gpt_100m bf16, that batch without and with
# torch.compile; the fused against the plain loss at iterations 2 and 3; memory truth on a few shapes;
# estimate truth. Each step runs only if its cost estimate fits the time left of GPU_CHECK_BUDGET_S
# (default 285 s) and is written the moment it ends; the runner, its files (5 under $OUT) and its
# statuses are described in scripts/gpu_check.py. Exit 1 on any miss; the summary table comes last.
#
# A rerun of named steps after a miss: GPU_CHECK_STEPS=finder_it3_bf16,bench_it3_bf16_found (names in
# results.jsonl), with the part's carry and a timeout that fits the device time left.
#
# GPU_CHECK_DEVICE=cpu runs the same steps on the CPU with preset tiny: the stand-in that tests it
# (tests/measure/test_benchmark_gpu_check.py). Python: $PYTHON, else the GPU machine's
# /opt/torch/.venv/bin/python3, else python3 when its torch sees CUDA, else .venv/bin/python.
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
exec "$PY" "$ROOT/scripts/gpu_check.py"
