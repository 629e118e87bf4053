"""Estimate truth: benchmark -> estimate -> a real training run about ten times longer, and how far
the estimate was from the clock.

Everything runs as the user would run it (`python -m buildllm benchmark`, `estimate`, `train`), in a
temporary folder whose params.yaml points at the project's token files, so nothing in the project
is touched. The training run is sized to --factor times the benchmark's steps (warm-up + measured)
and keeps the project's validation, logging and checkpoint intervals: the estimate must account for
them too. Target: the predicted total within ±10% of the train command's wall-clock time.

    python scripts/estimate_truth.py                          # iteration 1 (gpt_first_cpu) on the CPU
    python scripts/estimate_truth.py --preset tiny --factor 10 --measured-steps 20
    python scripts/estimate_truth.py --device cuda --iteration 2 --precision bf16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = 0.10


def params_for(args, work: Path) -> dict:
    from buildllm.config import load_config
    from buildllm.paths import token_paths, tokenizer_path
    from buildllm.plan import make_plan

    chosen = {"preset": args.preset} if args.preset else {"iteration": args.iteration}
    base = {**chosen, "device": args.device, "precision": args.precision}
    if args.batch_size:
        base["train.batch_size"] = args.batch_size
    if args.threads:
        base["train.threads"] = args.threads
    plan = make_plan(load_config(None, base))
    train, validation = token_paths(plan.config, plan.model.vocab_size)
    tokenizer = tokenizer_path(plan.config, plan.model.vocab_size)
    train, validation, tokenizer = (ROOT / train, ROOT / validation, ROOT / tokenizer)
    if not train.exists():
        raise SystemExit(f"no token file {train}; make it first with `buildllm corpus && buildllm tokenize"
                         f"{'' if args.preset else f' --iteration {args.iteration}'}` in {ROOT}")
    steps = args.factor * (args.warmup_steps + args.measured_steps)
    params = {
        **chosen, "device": args.device, "precision": args.precision,
        "train": {"batch_size": plan.batch_size, "threads": args.threads, "training_examples": steps * plan.batch_size,
                  "train_tokens": str(train), "validation_tokens": str(validation),
                  **({"tokenizer": str(tokenizer)} if tokenizer.exists() else {}),
                  "checkpoint_directory": str(work / "checkpoints")},
        "benchmark": {"warmup_steps": args.warmup_steps, "measured_steps": args.measured_steps,
                      "intervals": args.intervals},
    }
    return params


def run(step: list[str], work: Path) -> float:
    """Run `python -m buildllm <step>` in the work folder; return its wall-clock seconds."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "buildllm", *step], cwd=work, stdout=subprocess.PIPE,
                            text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"`buildllm {' '.join(step)}` failed with exit code {result.returncode}\n{result.stdout}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iteration", type=int, default=1, choices=(1, 2, 3))
    parser.add_argument("--preset", choices=("tiny", "student", "small"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--measured-steps", type=int, default=20)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--factor", type=int, default=10, help="training steps = factor x benchmark steps")
    parser.add_argument("--json", type=Path, help="also write the figures as flat JSON metrics here")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="buildllm-estimate-truth-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "params.yaml").write_text(yaml.safe_dump(params_for(args, work), sort_keys=False))
    print(f"working in {work}", flush=True)
    benchmark_wall = run(["benchmark"], work)
    run(["estimate"], work)
    train_wall = run(["train"], work)
    read = lambda name: json.loads((work / "metrics" / f"{name}.json").read_text())  # noqa: E731
    bench, est, trained = read("benchmark"), read("estimate"), read("train")

    predicted, actual = est["estimated_seconds"], train_wall
    error = predicted / actual - 1
    steps_error = est["estimated_seconds_by_steps"] / trained["train_seconds"] - 1
    predicted_overhead = predicted - est["estimated_seconds_by_steps"]
    print(f"\n{bench['profile']} on {bench['device']} ({bench['precision']}, batch {bench['batch_size']}, "
          f"{bench['threads']} threads): benchmark {bench['warmup_steps']}+{bench['measured_steps']} steps "
          f"in {benchmark_wall:.1f} s wall; training {trained['optimizer_steps']} steps")
    print(f"{'':<34}{'predicted':>11}{'actual':>11}{'error':>9}")
    print(f"{'optimizer steps (step time only)':<34}{est['estimated_seconds_by_steps']:>10.1f}s"
          f"{trained['train_seconds']:>10.1f}s{steps_error:>+9.1%}")
    print(f"{'everything else':<34}{predicted_overhead:>10.1f}s{actual - trained['train_seconds']:>10.1f}s")
    print(f"{'train command, wall clock':<34}{predicted:>10.1f}s{actual:>10.1f}s{error:>+9.1%}   "
          f"(range {est['estimated_seconds_low']:.1f}-{est['estimated_seconds_high']:.1f} s; "
          f"target ±{TARGET:.0%}: {'met' if abs(error) <= TARGET else 'missed'})")
    print(f"benchmark interval CV {bench['throughput_cv']:.1%}; training ran at {trained['steps_per_second']:.2f} "
          f"steps/s against {bench['steps_per_second']:.2f} measured")
    if args.json:
        from buildllm.metrics import write_metrics

        write_metrics(args.json, {
            "profile": bench["profile"], "device": bench["device"], "precision": bench["precision"],
            "planned_steps": trained["optimizer_steps"], "predicted_seconds": predicted, "actual_seconds": actual,
            "error": error, "predicted_step_seconds": est["estimated_seconds_by_steps"],
            "actual_step_seconds": trained["train_seconds"], "step_error": steps_error,
            "benchmark_throughput_cv": bench["throughput_cv"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
