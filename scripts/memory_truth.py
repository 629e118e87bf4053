"""Memory truth: the dry run's memory estimate against the benchmark's measured peak, per shape.

For each profile and a few batch sizes, a fresh process (so one shape's memory cannot colour the
next) builds the plan, loads the token files and runs the benchmark's own measurement (the Trainer's
step, warm-up and measured steps) around buildllm.device.peak_memory.PeakMemory. It prints the estimate,
the measured peak and their ratio; the target is within ±15%. Shapes whose estimate exceeds
--max-fraction of the memory available now are skipped, and so are vocabularies without token files.

    python scripts/memory_truth.py                        # CPU, fp32, every profile
    python scripts/memory_truth.py --precision fp32 bf16 --profiles tiny student
    python scripts/memory_truth.py --device cuda --precision bf16 --json out/memory_truth.json

Run it from anywhere; it works in the project root, where the token files are.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Profile -> batch sizes: each profile's CPU default, a smaller and a larger one.
SHAPES = {
    "tiny": (8, 32, 128),
    "student": (4, 16, 64),
    "gpt_first_cpu": (4, 16, 64),
    "small": (2, 8, 32),
    "gpt_42m": (1, 4),
    "gpt_100m": (1, 2),
}
ITERATIONS = {"gpt_first_cpu": 1, "gpt_42m": 2, "gpt_100m": 3}
TARGET = 0.15


def overrides(profile: str, batch_size: int, precision: str, device: str, architecture: str | None) -> dict:
    chosen = {"iteration": ITERATIONS[profile]} if profile in ITERATIONS else {"preset": profile}
    extra = {"model.architecture": architecture} if architecture else {}
    # Two measured steps after one warm-up: the peak is reached in the second step, once AdamW's
    # state exists beside a full forward and backward.
    return {**chosen, **extra, "device": device, "precision": precision, "train.batch_size": batch_size,
            "train.training_examples": None, "train.validation_examples": 8,
            "benchmark.warmup_steps": 1, "benchmark.measured_steps": 2, "benchmark.intervals": 1}


def plan_and_estimate(settings: dict):
    from buildllm.config import load_config
    from buildllm.measure.memory_estimate import plan_memory
    from buildllm.plan import make_plan

    config = load_config(None, settings)
    plan = make_plan(config)
    return config, plan, plan_memory(plan)


def measured_peak(settings: dict) -> int | None:
    """The peak of two training steps in a fresh process (the batch finder's own try); None if it did not fit."""
    from buildllm.measure.batch_finder import try_in_child
    from buildllm.config import load_config

    result = try_in_child(load_config(None, settings))
    return None if result["oom"] else result["peak_memory_bytes"]


def available_bytes(device: str) -> int:
    from buildllm.device.resolve import resolve_device

    return resolve_device(device).memory_free()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--profiles", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="instead of each profile's three")
    parser.add_argument("--architecture", choices=("classic", "modern"))
    parser.add_argument("--max-fraction", type=float, default=0.6,
                        help="skip shapes whose estimate exceeds this share of the memory available now")
    parser.add_argument("--json", type=Path, help="also write the figures as flat JSON metrics here")
    args = parser.parse_args(argv)
    json_path = args.json.resolve() if args.json else None  # before the chdir below

    from buildllm.errors import UserError
    from buildllm.paths import token_paths

    os.chdir(ROOT)  # token paths are relative to the project root
    limit = available_bytes(args.device) * args.max_fraction
    print(f"{'profile':<15}{'precision':<10}{'batch':>6}{'estimate MiB':>14}{'measured MiB':>14}{'ratio':>8}  "
          f"(target {1 - TARGET:.2f}-{1 + TARGET:.2f})", flush=True)
    results, ratios = {}, []
    for precision in args.precision:
        for profile in args.profiles:
            for batch_size in args.batch_sizes or SHAPES[profile]:
                settings = overrides(profile, batch_size, precision, args.device, args.architecture)
                try:
                    config, plan, estimate = plan_and_estimate(settings)
                except UserError as exc:
                    print(f"{profile:<15}{precision:<10}{batch_size:>6}  skipped: {exc}", flush=True)
                    continue
                train_path, _ = token_paths(config, plan.model.vocab_size)
                label = f"{profile:<15}{precision:<10}{batch_size:>6}{estimate.total / 2**20:>14.1f}"
                if not train_path.exists():
                    print(f"{label}  skipped: no {train_path} (make it with `buildllm tokenize "
                          f"--iteration {ITERATIONS.get(profile, 1)}`)", flush=True)
                    continue
                if estimate.total > limit:
                    print(f"{label}  skipped: over {args.max_fraction:.0%} of the memory available", flush=True)
                    continue
                peak = measured_peak(settings)
                if not peak:
                    print(f"{label}  measurement failed (see the error above)", flush=True)
                    continue
                ratio = estimate.total / peak
                ratios.append(ratio)
                mark = "" if abs(ratio - 1) <= TARGET else "  outside the target"
                print(f"{label}{peak / 2**20:>14.1f}{ratio:>8.3f}{mark}", flush=True)
                key = f"{profile}_{precision}_b{batch_size}"
                results.update({f"{key}_estimate_bytes": estimate.total, f"{key}_measured_bytes": peak,
                                f"{key}_ratio": ratio})
    if ratios:
        within = sum(abs(r - 1) <= TARGET for r in ratios)
        print(f"{within} of {len(ratios)} shapes within ±{TARGET:.0%}; ratios {min(ratios):.3f} to {max(ratios):.3f} "
              f"(estimate / measured, {args.device})")
    if json_path:
        from buildllm.metrics import write_metrics

        write_metrics(json_path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
