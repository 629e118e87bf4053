"""bf16 autocast against fp32 on this CPU, per profile: Trainer.step() speed, interleaved in one process.

    python scripts/bf16_gain.py --profiles iteration1 student small --rounds 12

Two trainers (fp32 and bf16 autocast) on the same random tokens take turns: a few steps of one, a
few of the other, round after round, so a competing job slows both alike; the figure is the median
of the per-round time ratios, printed. A lab script over several profiles: what decides
`precision: auto` is `buildllm tune`'s measurement on the machine that runs, in metrics/tune.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

from random_tokens import PROFILES, cpu_plan, random_token_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["iteration1"], choices=sorted(PROFILES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2, help="steps per turn")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    for profile in args.profiles:
        total = args.warmup + args.rounds * args.steps
        sides = {p: random_token_trainer(cpu_plan(profile, p, args.threads, settings={"train.compile": "false"}), total)
                 for p in ("fp32", "bf16")}
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
        print(f"{profile}: bf16 autocast x{speedup:.3f} fp32's speed (median of {args.rounds} rounds, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
