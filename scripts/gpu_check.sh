#!/usr/bin/env bash
# GPU check: on a CUDA machine, in one go and under 8 minutes on one H200:
#   1. the environment (`buildllm env`) and the CUDA-marked tests (`pytest -m cuda`);
#   2. token files for iterations 1-3 (vocabularies 4096 and 16384), made only if missing;
#   3. a bounded `buildllm benchmark` of iterations 1, 2 and 3 in bf16, fp16 and fp32;
#   4. the batch-size finder on gpt_100m bf16, then gpt_100m bf16 at the batch it found, without and
#      with torch.compile (tokens/s and MFU against the device's dense bf16 peak);
#   5. time permitting, the memory-truth and estimate-truth scripts on the GPU.
#
# The device tool's call, from the repository root here, after `dvc repro tokenize` and
# `dvc exp run --temp -S iteration=3 tokenize` (or `buildllm tokenize --iteration 3`) have written the
# token files and tokenizers for vocabularies 4096 and 16384 (the GPU machine has no DVC, no corpus
# package and no network; torch, tokenizers, pandas, pyyaml, psutil, tqdm, matplotlib and pytest are there):
#   run(command="bash scripts/gpu_check.sh", carry=["data/tokens", "tokenizer"], timeout_s=540)
# It writes at most 6 files under $OUT: env.json, pytest_cuda.log, gpu_check.log, combined.json,
# summary.txt, runs.tar.gz.
# Every result lands in one folder: $GPU_CHECK_OUT, else $OUT, else ./gpu_check_out. It holds
# env.json, pytest_cuda.log, gpu_check.log, combined.json (every run's metrics, keyed by run) and
# summary.txt; the runs' own JSON files are in runs/ (bundled as runs.tar.gz, and removed when
# writing to $OUT, whose transfer keeps few files).
#
# Python: $PYTHON, else python3 when its torch sees CUDA (as on the lent GPU machines, which have
# torch but no network), else .venv/bin/python. The package runs from this tree (PYTHONPATH), so
# nothing is installed; dvc is not needed. The corpus needs the wiki package or a carried
# data/corpus/ folder; with neither, carry data/tokens and tokenizer/ instead.
#
# GPU_CHECK_DEVICE=cpu runs the same loop on the CPU with preset tiny in seconds (fp16 is refused
# there, by design): it is how the script is tested without a GPU (tests/test_benchmark_gpu_check.py).
# GPU_CHECK_BUDGET_S (default 420) skips the optional step 4 once that many seconds have passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
RESULTS="${GPU_CHECK_OUT:-${OUT:-$ROOT/gpu_check_out}}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-420}"
START_S=$SECONDS
mkdir -p "$RESULTS/runs"
RESULTS="$(cd "$RESULTS" && pwd)"
LOG="$RESULTS/gpu_check.log"
: >"$LOG"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1

say() { echo "[gpu_check $((SECONDS - START_S))s] $*" | tee -a "$LOG"; }

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ "$DEVICE" == cuda* ]] && has_cuda_torch python3; then
  PY=python3
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python3
fi
if [[ "$DEVICE" == cuda* && -n "${PYTHON:-}" ]] && ! has_cuda_torch "$PY"; then
  say "error: $PY has no CUDA-enabled torch, or sees no GPU; run on a CUDA machine, or GPU_CHECK_DEVICE=cpu"
  exit 1
fi
if [[ "$DEVICE" == cuda* ]] && ! has_cuda_torch "$PY"; then
  say "$PY has no CUDA-enabled torch (or no GPU is visible); installing torch==2.13.0 into .venv-gpu"
  python3 -m venv "$ROOT/.venv-gpu"
  "$ROOT/.venv-gpu/bin/pip" install -q torch==2.13.0 -e "$ROOT[test]" \
    || { say "error: could not install a CUDA torch (no network?); run where python3 has one"; exit 1; }
  PY="$ROOT/.venv-gpu/bin/python"
  has_cuda_torch "$PY" || { say "error: torch installed but CUDA is still not available; is there a GPU?"; exit 1; }
fi
say "python: $PY; device: $DEVICE; results: $RESULTS"

if [[ "$DEVICE" == cpu ]]; then
  MODELS=("--preset tiny")
  PRECISIONS=(bf16 fp16 fp32)
  BOUNDS=$'benchmark: {warmup_steps: 1, measured_steps: 4, intervals: 2}\ntrain: {training_examples: 64, validation_examples: 16, threads: 1}'
  TESTS="${GPU_CHECK_TESTS:-tests/test_cuda.py}"
  MEMORY_ARGS=(--sets fitted --profiles tiny --batch-sizes 8 --repeats 1)
  ESTIMATE_ARGS=(--preset tiny --warmup-steps 1 --measured-steps 4 --intervals 2 --factor 3 --threads 1)
  LARGE="--preset tiny"
  FINDER_BOUNDS=$'benchmark: {warmup_steps: 1, measured_steps: 2, intervals: 1, max_batch_size: 16}\ntrain: {training_examples: 64, validation_examples: 16, threads: 1}'
else
  MODELS=("--iteration 1" "--iteration 2" "--iteration 3")
  PRECISIONS=(bf16 fp16 fp32)
  BOUNDS=$'benchmark: {warmup_steps: 3, measured_steps: 20, intervals: 4}\ntrain: {training_examples: 800, validation_examples: 64}'
  TESTS="${GPU_CHECK_TESTS:-tests}"
  MEMORY_ARGS=(--profiles gpt_first_cpu small gpt_42m gpt_100m --batch-sizes 8 32 --repeats 1)
  ESTIMATE_ARGS=(--iteration 1 --precision bf16 --factor 10)
  LARGE="--iteration 3"
  FINDER_BOUNDS=$'benchmark: {warmup_steps: 2, measured_steps: 4, intervals: 1, max_batch_size: 256}\ntrain: {training_examples: 2048, validation_examples: 64}'
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/buildllm-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
printf '%s\n' "$BOUNDS" >"$WORK/params.yaml"

# 1. Environment and the CUDA tests.
"$PY" -m buildllm env --device "$DEVICE" 2>&1 | tee -a "$LOG"
"$PY" -m buildllm env --device "$DEVICE" --json >"$RESULTS/env.json"
say "pytest -m cuda $TESTS"
PYTEST_RC=0
(cd "$ROOT" && "$PY" -m pytest -q -p no:cacheprovider -m cuda $TESTS) >"$RESULTS/pytest_cuda.log" 2>&1 || PYTEST_RC=$?
tail -n 3 "$RESULTS/pytest_cuda.log" | tee -a "$LOG"
# pytest exits 5 when no test was selected: nothing failed.
[[ $PYTEST_RC -eq 5 ]] && PYTEST_RC=0

# 2. Token files: iteration 1 uses vocabulary 4096, iterations 2 and 3 share 16384.
vocab_of() { case "$1" in *tiny*|*student*|*small*|*"iteration 1"*) echo 4096 ;; *) echo 16384 ;; esac; }
tokens_of() { echo "$ROOT/data/tokens/wiki_vital_$1"; }
for model in "${MODELS[@]}"; do
  vocab="$(vocab_of "$model")"
  [[ -f "$(tokens_of "$vocab")/train_tokens.pt" ]] && continue
  if [[ ! -f "$ROOT/data/corpus/wiki_vital/train.jsonl" ]]; then
    say "building the corpus"
    (cd "$ROOT" && "$PY" -m buildllm corpus) >>"$LOG" 2>&1 \
      || { say "error: no corpus and \`buildllm corpus\` failed (see $LOG); carry data/corpus or data/tokens"; exit 1; }
  fi
  say "tokenizing for vocabulary $vocab"
  (cd "$ROOT" && "$PY" -m buildllm tokenize $model) >>"$LOG" 2>&1 \
    || { say "error: \`buildllm tokenize $model\` failed (see $LOG)"; exit 1; }
done

# 3. Bounded benchmarks, each in a scratch folder so the project's metrics/ stays untouched.
CRASHED=0
bench() {  # bench NAME MODEL ARGS...: one benchmark, its metrics kept as runs/NAME.json
  local name="$1" model="$2" rc=0 tokens
  shift 2
  tokens="$(tokens_of "$(vocab_of "$model")")"
  rm -f "$WORK/metrics/benchmark.json"
  say "$name"
  (cd "$WORK" && "$PY" -m buildllm benchmark $model --device "$DEVICE" "$@" \
    --train-tokens "$tokens/train_tokens.pt" --validation-tokens "$tokens/validation_tokens.pt") \
    >>"$LOG" 2>"$WORK/stderr" || rc=$?
  grep -v $'\r' "$WORK/stderr" >>"$LOG" || true
  [[ -f "$WORK/metrics/benchmark.json" ]] && cp "$WORK/metrics/benchmark.json" "$RESULTS/runs/$name.json"
  case $rc in
    0) ;;
    2|3) say "$name: $(tail -n 1 "$WORK/stderr")" ;;  # refused or out of memory: reported, not a crash
    *) say "$name crashed with exit code $rc"; CRASHED=1 ;;
  esac
  return 0
}
for model in "${MODELS[@]}"; do
  for precision in "${PRECISIONS[@]}"; do
    bench "benchmark_$(echo "$model" | tr -d ' -')_$precision" "$model" --precision "$precision"
  done
done

# 4. The batch-size finder on the largest profile in bf16, then that batch without and with compile.
large="$(echo "$LARGE" | tr -d ' -')"
printf '%s\n' "$FINDER_BOUNDS" >"$WORK/params.yaml"
tokens="$(tokens_of "$(vocab_of "$LARGE")")"
say "batch-size finder $LARGE bf16"
rm -f "$WORK/metrics/batch_size.json"
(cd "$WORK" && "$PY" -m buildllm benchmark $LARGE --device "$DEVICE" --precision bf16 --find-batch-size \
  --train-tokens "$tokens/train_tokens.pt" --validation-tokens "$tokens/validation_tokens.pt") >>"$LOG" 2>&1 \
  || { say "batch-size finder failed"; CRASHED=1; }
printf '%s\n' "$BOUNDS" >"$WORK/params.yaml"
found=0
if [[ -f "$WORK/metrics/batch_size.json" ]]; then
  cp "$WORK/metrics/batch_size.json" "$RESULTS/runs/batch_size_${large}_bf16.json"
  found="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["found_batch_size"])' "$WORK/metrics/batch_size.json")"
fi
if (( found > 0 )); then
  bench "benchmark_${large}_bf16_b${found}" "$LARGE" --precision bf16 --batch-size "$found"
  bench "benchmark_${large}_bf16_b${found}_compile" "$LARGE" --precision bf16 --batch-size "$found" --compile
fi

# 5. Memory truth and estimate truth, while time is left.
if (( SECONDS - START_S < BUDGET_S )); then
  say "memory truth"
  "$PY" "$ROOT/scripts/memory_truth.py" --device "$DEVICE" --precision bf16 fp32 "${MEMORY_ARGS[@]}" \
    --json "$RESULTS/runs/memory_truth.json" 2>>"$LOG" | tee -a "$LOG" || say "memory truth failed"
fi
if (( SECONDS - START_S < BUDGET_S )); then
  say "estimate truth"
  "$PY" "$ROOT/scripts/estimate_truth.py" --device "$DEVICE" "${ESTIMATE_ARGS[@]}" --keep "$WORK/estimate_truth" \
    --json "$RESULTS/runs/estimate_truth.json" 2>>"$LOG" | tee -a "$LOG" || say "estimate truth failed"
fi

# One combined file and a table, then the bundle.
"$PY" - "$RESULTS" <<'PY' | tee "$RESULTS/summary.txt" | tee -a "$LOG"
import json, sys
from pathlib import Path
results = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted((results / "runs").glob("*.json"))}
(results / "combined.json").write_text(json.dumps(runs, indent=1))
print(f"{'run':<34}{'tokens/s':>12}{'steps/s':>9}{'MFU':>7}{'peak MiB':>10}{'est/peak':>9}  peak FLOP/s source")
for name, m in runs.items():
    if not name.startswith("benchmark"):
        continue
    if m.get("oom"):
        print(f"{name:<34}  out of memory at batch size {m.get('oom_batch_size')}")
        continue
    print(f"{name:<34}{m['tokens_per_second']:>12,.0f}{m['steps_per_second']:>9.2f}{m['mfu']:>7.1%}"
          f"{m['peak_memory_bytes'] / 2**20:>10.0f}{m['memory_estimate_ratio']:>9.2f}  {m['peak_flops_source'][:40]}")
PY
tar -C "$RESULTS" -czf "$RESULTS/runs.tar.gz" runs
if [[ -n "${OUT:-}" && "$RESULTS" == "$(cd "$OUT" && pwd)" ]]; then
  rm -rf "$RESULTS/runs"
fi
say "done in $((SECONDS - START_S)) s; pytest exit code $PYTEST_RC; results in $RESULTS"
[[ $PYTEST_RC -eq 0 && $CRASHED -eq 0 ]]
