"""torch.compile on this machine, per profile: compile seconds and steady speed-up of Trainer.step().

    python scripts/compile_gain.py --profiles iteration1 student small --pairs 3 --write

Each measurement is a fresh process; plain and compiled alternate (plain, compiled, plain, ...), so a
competing job slows both alike. A process times its first --warmup steps (compilation lands there),
then --intervals intervals of --steps steps (median). Compile seconds = compiled warm-up minus plain
warm-up; speed-up = plain step time / compiled step time; medians over the pairs.
--write stores the figures, with their source, in buildllm/train/compile_measurements.yaml, where
`train.compile: auto` reads them (buildllm/train/compile_choice.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "buildllm" / "train" / "compile_measurements.yaml"
PROFILES = {"iteration1": {"iteration": 1}, "student": {"preset": "student"}, "small": {"preset": "small"},
            "tiny": {"preset": "tiny"}}


def child(args) -> None:
    from buildllm.config import load_config
    from buildllm.data.windows import Windows
    from buildllm.plan import apply_plan, make_plan
    from buildllm.train.trainer import Trainer

    settings = {**PROFILES[args.profile], "device": "cpu", "precision": "fp32", "train.threads": args.threads,
                "train.training_examples": None, "train.compile": args.child == "compiled"}
    plan = make_plan(load_config(None, settings))
    apply_plan(plan)
    length, steps = plan.model.sequence_length, args.warmup + args.intervals * args.steps
    tokens = torch.randint(plan.model.vocab_size, ((steps + 1) * plan.batch_size * length + 1,),
                           generator=torch.Generator().manual_seed(0)).to(torch.uint16)
    trainer = Trainer(plan, Windows(tokens, length), None, directory=tempfile.mkdtemp(prefix="compile-gain-"))
    begin = time.perf_counter()
    for _ in range(args.warmup):
        trainer.step()
    warmup = time.perf_counter() - begin
    intervals = []
    for _ in range(args.intervals):
        begin = time.perf_counter()
        for _ in range(args.steps):
            trainer.step()
        intervals.append((time.perf_counter() - begin) / args.steps)
    print(json.dumps({"warmup_seconds": warmup, "step_seconds": statistics.median(intervals)}))


def measure(args, profile: str, mode: str) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--profiles", profile, "--threads", str(args.threads),
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--intervals", str(args.intervals)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise SystemExit(f"{profile} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["iteration1"], choices=sorted(PROFILES))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--write", action="store_true", help=f"store the figures in {FIGURES.relative_to(ROOT)}")
    parser.add_argument("--child", choices=("plain", "compiled"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.profile = args.profiles[0]
        return child(args)
    figures = yaml.safe_load(FIGURES.read_text()) if FIGURES.exists() else {}
    figures = figures or {}
    load = os.getloadavg()[0]
    for profile in args.profiles:
        compile_seconds, speedups, plain_steps = [], [], []
        for pair in range(args.pairs):
            plain, compiled = measure(args, profile, "plain"), measure(args, profile, "compiled")
            compile_seconds.append(compiled["warmup_seconds"] - plain["warmup_seconds"])
            speedups.append(plain["step_seconds"] / compiled["step_seconds"])
            plain_steps.append(plain["step_seconds"])
            print(f"{profile} pair {pair + 1}/{args.pairs}: plain {plain['step_seconds'] * 1000:.0f} ms/step, compiled "
                  f"{compiled['step_seconds'] * 1000:.0f} ms/step (x{speedups[-1]:.3f}), compile "
                  f"{compile_seconds[-1]:.1f} s", flush=True)
        entry = {"compile_seconds": round(statistics.median(compile_seconds), 1),
                 "speedup": round(statistics.median(speedups), 3),
                 "plain_step_seconds": round(statistics.median(plain_steps), 4), "precision": "fp32",
                 "source": (f"scripts/compile_gain.py, {args.pairs} interleaved pairs, {args.threads} threads, fp32, "
                            f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
                            f"{os.cpu_count()} CPUs, load average {load:.1f} at start, "
                            f"{datetime.date.today().isoformat()}")}
        print(f"{profile}: {json.dumps(entry)}", flush=True)
        figures.setdefault(profile_name(profile), {})["cpu"] = entry
    if args.write:
        header = ("# torch.compile measured per profile and device kind (scripts/compile_gain.py --write).\n"
                  "# `train.compile: auto` compiles when the speed-up pays back compile_seconds within the run.\n")
        FIGURES.write_text(header + yaml.safe_dump(figures, sort_keys=True))
        print(f"written to {FIGURES}")


def profile_name(profile: str) -> str:
    return "gpt_first_cpu" if profile == "iteration1" else profile


if __name__ == "__main__":
    main()
