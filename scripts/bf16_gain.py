"""bf16 autocast against fp32 on this CPU, per profile: Trainer.step() speed, interleaved in one process.

    python scripts/bf16_gain.py --profiles iteration1 student small --rounds 12 --out bf16_gain.yaml

Two trainers (fp32 and bf16 autocast) on the same random tokens take turns: a few steps of one, a
few of the other, round after round, so a competing job slows both alike; the figure is the median
of the per-round time ratios. --out writes it with its source as YAML under the working directory
(never into the package: `buildllm tune` measures what `precision: auto` decides). fp32 stays the
CPU default either way.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
from lab import PROFILES, cpu_plan, random_token_trainer, write_figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["iteration1"], choices=sorted(PROFILES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2, help="steps per turn")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the figures as YAML here (e.g. bf16_gain.yaml)")
    args = parser.parse_args()
    from buildllm.device.hardware import processor_name

    figures = {}
    load = os.getloadavg()[0]
    for profile in args.profiles:
        total = args.warmup + args.rounds * args.steps
        sides = {
            p: random_token_trainer(cpu_plan(profile, p, args.threads, settings={"train.compile": "false"}), total)
            for p in ("fp32", "bf16")
        }
        for side in sides.values():
            for _ in range(args.warmup):
                side.step()
        ratios = []
        for _ in range(args.rounds):
            seconds = {}
            for name, side in sides.items():
                begin = time.perf_counter()
                for _ in range(args.steps):
                    side.step()
                seconds[name] = time.perf_counter() - begin
            ratios.append(seconds["fp32"] / seconds["bf16"])
        speedup = statistics.median(ratios)
        name = sides["fp32"].plan.profile.name
        print(
            f"{profile}: bf16 autocast x{speedup:.3f} fp32's speed (median of {args.rounds} rounds, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f})",
            flush=True,
        )
        figures.setdefault(name, {})["bf16_speedup"] = round(speedup, 3)
        figures[name]["source"] = (
            f"scripts/bf16_gain.py, {args.rounds} interleaved rounds of {args.steps} steps, "
            f"{args.threads} threads, torch {torch.__version__}, {processor_name()}, "
            f"load average {load:.1f} at start, {datetime.date.today().isoformat()}"
        )
    if args.out:
        header = "# bf16 autocast / fp32 training-step speed on this machine, per profile (scripts/bf16_gain.py)\n"
        print(f"written to {write_figures(args.out, figures, header)}")


if __name__ == "__main__":
    main()
