"""torch.compile on this machine, per profile: compile seconds and steady speed-up of Trainer.step().

    python scripts/compile_gain.py --profiles iteration1 student small --processes 2 --out compile_gain.yaml

Each fresh process (with a cold inductor cache) builds a plain and a compiled trainer and times
their first --warmup steps (compilation lands there); then they take turns, --steps steps each,
for --rounds rounds, so a competing job slows both alike. Compile seconds = compiled warm-up minus
plain warm-up; speed-up = median over the turns of plain time / compiled time; medians over processes.
--out writes the figures, with their source, as YAML under the working directory (never into the
package: a machine's figures belong to that machine; `buildllm tune` measures the decisions it makes).
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
from lab import PROFILES, cpu_plan, profile_name, random_token_trainer, write_figures

ROOT = Path(__file__).resolve().parent.parent


def trainer(args, compiled: bool):
    plan = cpu_plan(args.profile, "fp32", args.threads, settings={"train.compile": "true" if compiled else "false"})
    return random_token_trainer(plan, args.warmup + args.rounds * args.steps)


def child(args) -> None:
    # Both trainers in one process, taking turns (a few steps each, round after round): a competing
    # job slows both alike. The compiled one's warm-up includes compilation, from a cold cache.
    sides = {"plain": trainer(args, False), "compiled": trainer(args, True)}
    warmup = {}
    for name, side in sides.items():
        begin = time.perf_counter()
        for _ in range(args.warmup):
            side.step()
        warmup[name] = time.perf_counter() - begin
    seconds = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, side in sides.items():
            begin = time.perf_counter()
            for _ in range(args.steps):
                side.step()
            seconds[name].append((time.perf_counter() - begin) / args.steps)
    ratios = [p / c for p, c in zip(seconds["plain"], seconds["compiled"])]
    print(
        json.dumps(
            {
                "compile_seconds": warmup["compiled"] - warmup["plain"],
                "speedup": statistics.median(ratios),
                "plain_step_seconds": statistics.median(seconds["plain"]),
            }
        )
    )


def measure(args, profile: str) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        "--profiles",
        profile,
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--rounds",
        str(args.rounds),
    ]
    # A fresh inductor cache: the first compile on a machine is a cold one (a warm cache takes ~1 s).
    with tempfile.TemporaryDirectory(prefix="compile-gain-cache-") as cache:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": cache},
        )
    if done.returncode:
        raise SystemExit(f"{profile} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["iteration1"], choices=sorted(PROFILES))
    parser.add_argument("--processes", type=int, default=2, help="fresh processes per profile (medians taken)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="turns of --steps steps each side takes")
    parser.add_argument("--out", type=Path, help="also write the figures as YAML here (e.g. compile_gain.yaml)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.profile = args.profiles[0]
        return child(args)
    figures = {}
    load = os.getloadavg()[0]
    for profile in args.profiles:
        compile_seconds, speedups, plain_steps = [], [], []
        for run in range(args.processes):
            figures_ = measure(args, profile)
            compile_seconds.append(figures_["compile_seconds"])
            speedups.append(figures_["speedup"])
            plain_steps.append(figures_["plain_step_seconds"])
            print(
                f"{profile} process {run + 1}/{args.processes}: plain {plain_steps[-1] * 1000:.0f} ms/step, "
                f"compiled x{speedups[-1]:.3f} (median of {args.rounds} turns), compile {compile_seconds[-1]:.1f} s",
                flush=True,
            )
        entry = {
            "compile_seconds": round(statistics.median(compile_seconds), 1),
            "speedup": round(statistics.median(speedups), 3),
            "plain_step_seconds": round(statistics.median(plain_steps), 4),
            "precision": "fp32",
            "source": (
                f"scripts/compile_gain.py, {args.processes} processes of {args.rounds} interleaved turns, "
                f"cold inductor cache, {args.threads} threads, fp32, "
                f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
                f"{os.cpu_count()} CPUs, load average {load:.1f} at start, "
                f"{datetime.date.today().isoformat()}"
            ),
        }
        print(f"{profile}: {json.dumps(entry)}", flush=True)
        figures.setdefault(profile_name(profile), {})["cpu"] = entry
    if args.out:
        header = "# torch.compile measured per profile and device kind on this machine (scripts/compile_gain.py).\n"
        print(f"written to {write_figures(args.out, figures, header)}")


if __name__ == "__main__":
    main()
