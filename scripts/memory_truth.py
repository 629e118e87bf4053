"""Memory truth: the dry run's memory estimate against the benchmark's measured peak, per shape.

Two sets of shapes, printed apart:
- fitted: each profile at three batch sizes, and seven gradient-checkpointing shapes: the shapes the
  CPU constants and checkpointing's range in buildllm/predict/memory_estimate.py were chosen on;
- held out: shapes no constant was chosen on (the modern architecture, gradient accumulation,
  gradient checkpointing, other sequence lengths, odd batch sizes, and bf16 with each). A model
  that only fits its calibration shapes fails here.

For each shape a fresh process (so one shape's memory cannot colour the next) builds the plan,
loads the token files and runs the benchmark's own measurement (the Trainer's step, warm-up and
measured steps) around buildllm.device.peak_memory.PeakMemory. It prints the estimate, the
measured peak (the median of --repeats fresh processes, each run's figure beside it) and their
ratio. Target: the measured peak inside the estimate's stated range
(memory_estimate_low/high: -15%/+25% on the CPU, where glibc's retained blocks vary from run to
run; ±15% on CUDA); how many ratios fall within ±15% is printed beside. The script exits 1 when
a figure misses its target.
On CUDA the estimate predicts the caching allocator's *allocated* peak (live tensors); the
*reserved* peak (what the allocator holds from the driver, what nvidia-smi shows) is printed
beside it with its own ratio, for information. Shapes whose estimate exceeds --max-fraction of
the memory available now are skipped, and so are vocabularies without token files.

    python scripts/memory_truth.py                        # CPU: fitted (fp32) and held-out sets
    python scripts/memory_truth.py --sets held_out        # only the shapes never fitted
    python scripts/memory_truth.py --precision fp32 bf16 --profiles tiny student
    python scripts/memory_truth.py --device cuda --json out/memory_truth.json

Run it from anywhere; it works in the project root, where the token files are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Shape:
    profile: str
    batch_size: int
    precision: str = "fp32"
    architecture: str | None = None
    grad_accum: int = 1
    checkpointing: bool = False
    sequence_length: int | None = None

    @property
    def label(self) -> str:
        extra = [self.architecture or "",
                 f"accum {self.grad_accum}" if self.grad_accum > 1 else "",
                 "ckpt" if self.checkpointing else "",
                 f"seq {self.sequence_length}" if self.sequence_length else ""]
        return f"{self.profile} {self.precision} b{self.batch_size} " + " ".join(e for e in extra if e)

    @property
    def key(self) -> str:
        return "_".join(self.label.replace(" ", "_").split("__")).strip("_")


# Gradient checkpointing's range (buildllm/predict/memory_estimate.py, remade_after_backward) was
# chosen on these, fp32: they belong with the fitted set. gpt_first_cpu b24 was a held-out shape
# until its miss led to that range.
FITTED_CHECKPOINTING = [
    Shape("gpt_first_cpu", 8, checkpointing=True),
    Shape("gpt_first_cpu", 24, checkpointing=True),
    Shape("gpt_first_cpu", 48, checkpointing=True),
    Shape("student", 16, checkpointing=True),
    Shape("student", 16, architecture="modern", checkpointing=True),
    Shape("tiny", 64, checkpointing=True),
    Shape("small", 4, checkpointing=True),
]

# Never used to choose a constant: other architectures, accumulation, checkpointing, sequence
# lengths and odd batch sizes, each in fp32 and in bf16. All use the 4,096-token vocabulary, so
# the iteration-1 token files are enough, and all take seconds each on two CPU cores.
_HELD_OUT_FP32 = [
    Shape("student", 12, architecture="modern"),
    Shape("gpt_first_cpu", 16, grad_accum=4),
    Shape("gpt_first_cpu", 32, checkpointing=True, sequence_length=96),
    Shape("student", 28, checkpointing=True),
    Shape("tiny", 100, checkpointing=True, grad_accum=2),
    Shape("small", 6, sequence_length=64),
    Shape("tiny", 37),
    Shape("small", 3, architecture="modern", grad_accum=2, checkpointing=True, sequence_length=128),
    Shape("student", 20, architecture="modern", sequence_length=96),
]
HELD_OUT = [*_HELD_OUT_FP32, *(Shape(**{**s.__dict__, "precision": "bf16"}) for s in _HELD_OUT_FP32)]


def overrides(shape: Shape, device: str) -> dict:
    chosen = {"iteration": ITERATIONS[shape.profile]} if shape.profile in ITERATIONS else {"preset": shape.profile}
    extra = {"model.architecture": shape.architecture} if shape.architecture else {}
    if shape.sequence_length:
        extra["model.sequence_length"] = shape.sequence_length
    # Two measured steps after one warm-up: the peak is reached in the second step, once AdamW's
    # state exists beside a full forward and backward.
    return {**chosen, **extra, "device": device, "precision": shape.precision, "train.batch_size": shape.batch_size,
            "train.grad_accum": shape.grad_accum, "train.gradient_checkpointing": shape.checkpointing,
            "train.training_examples": None, "train.validation_examples": 8,
            "benchmark.warmup_steps": 1, "benchmark.measured_steps": 2, "benchmark.intervals": 1}


def plan_and_estimate(settings: dict):
    from buildllm.config import load_config
    from buildllm.predict.memory_estimate import plan_memory
    from buildllm.plan import make_plan

    config = load_config(None, settings)
    plan = make_plan(config)
    return config, plan, plan_memory(plan)


def measured_peak(settings: dict) -> dict | None:
    """Two training steps in a fresh process (the batch finder's own try); None if it did not fit."""
    from buildllm.measure.batch_finder import try_in_child
    from buildllm.config import load_config

    result = try_in_child(load_config(None, settings))
    return None if result["oom"] else result


def available_bytes(device: str) -> int:
    from buildllm.device.resolve import resolve_device

    return resolve_device(device).memory_free()


def run_set(name: str, shapes: list[Shape], args, limit: float, results: dict) -> tuple[int, int]:
    """Measure each shape; returns (figures within target, figures measured)."""
    from buildllm.errors import UserError
    from buildllm.paths import token_paths

    cuda = args.device.startswith("cuda")
    print(f"\n{name} set ({len(shapes)} shapes); target: the measured peak inside the estimate's stated range",
          flush=True)
    print(f"{'shape':<48}{'estimate MiB':>13}{'range MiB':>16}{'measured MiB':>14}{'ratio':>7}"
          + f"{'runs MiB':>14}" + (f"{'reserved MiB':>14}{'ratio':>7}" if cuda else ""), flush=True)
    within = measured = close = single_misses = singles = 0
    for shape in shapes:
        settings = overrides(shape, args.device)
        try:
            config, plan, estimate = plan_and_estimate(settings)
        except UserError as exc:
            print(f"{shape.label:<48}  skipped: {exc}", flush=True)
            continue
        train_path, _ = token_paths(config, plan.model.vocab_size)
        span = f"{estimate.low / 2**20:.0f}-{estimate.high / 2**20:.0f}"
        label = f"{shape.label:<48}{estimate.total / 2**20:>13.1f}{span:>16}"
        if not train_path.exists():
            print(f"{label}  skipped: no {train_path} (make it with `buildllm tokenize "
                  f"--iteration {ITERATIONS.get(shape.profile, 1)}`)", flush=True)
            continue
        if estimate.high > limit:
            print(f"{label}  skipped: over {args.max_fraction:.0%} of the memory available", flush=True)
            continue
        tries = [measured_peak(settings) for _ in range(args.repeats)]
        if not all(tries):
            print(f"{label}  did not fit (out of memory)", flush=True)
            continue
        tries.sort(key=lambda t: t["peak_memory_bytes"])
        peaks = [t["peak_memory_bytes"] for t in tries]
        peak = statistics.median(peaks)
        result = tries[len(tries) // 2]  # the median run's reserved figure (CUDA)
        single_misses += sum(not estimate.low <= p <= estimate.high for p in peaks)
        singles += len(peaks)
        ratio = estimate.total / peak
        ok = estimate.low <= peak <= estimate.high
        measured += 1
        within += ok
        close += abs(ratio - 1) <= TARGET
        line = f"{label}{peak / 2**20:>14.1f}{ratio:>7.3f}{peaks[0] / 2**20:>9.0f}-{peaks[-1] / 2**20:.0f}"
        if cuda and result.get("peak_memory_reserved_bytes"):
            reserved = result["peak_memory_reserved_bytes"]
            line += f"{reserved / 2**20:>14.1f}{estimate.total / reserved:>7.3f}"
            results[f"{name}_{shape.key}_reserved_bytes"] = reserved
        print(line + ("" if ok else "  MISSES the target"), flush=True)
        results.update({f"{name}_{shape.key}_estimate_bytes": estimate.total,
                        f"{name}_{shape.key}_measured_bytes": peak, f"{name}_{shape.key}_ratio": ratio})
    print(f"{name}: {within} of {measured} shapes inside the stated range; {close} of {measured} ratios within "
          f"±{TARGET:.0%}; {single_misses} of {singles} single runs outside the range", flush=True)
    return within, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sets", nargs="+", default=["fitted", "held_out"], choices=("fitted", "held_out"))
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16", "fp16"),
                        help="precisions of the fitted set (the held-out set has its own, fp32 and bf16)")
    parser.add_argument("--profiles", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                        help="profiles of the fitted set")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="for the fitted set, instead of each profile's three")
    parser.add_argument("--max-fraction", type=float, default=0.6,
                        help="skip shapes whose estimate exceeds this share of the memory available now")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fresh processes per shape; the median peak is judged (glibc's retained blocks move "
                             "one run's peak by up to ±10%%), and every run's figure is shown")
    parser.add_argument("--json", type=Path, help="also write the figures as flat JSON metrics here")
    args = parser.parse_args(argv)
    json_path = args.json.resolve() if args.json else None  # before the chdir below

    os.chdir(ROOT)  # token paths are relative to the project root
    limit = available_bytes(args.device) * args.max_fraction
    fitted = [Shape(profile, batch_size, precision) for precision in args.precision for profile in args.profiles
              for batch_size in args.batch_sizes or SHAPES[profile]]
    if not args.batch_sizes:
        fitted += [s for s in FITTED_CHECKPOINTING if s.profile in args.profiles and s.precision in args.precision]
    held_out = [s for s in HELD_OUT if s.precision != "fp16" or args.device != "cpu"]
    results: dict = {}
    verdicts = {name: run_set(name, shapes, args, limit, results)
                for name, shapes in (("fitted", fitted), ("held_out", held_out)) if name in args.sets}
    print()
    failed = False
    for name, (within, measured) in verdicts.items():
        print(f"{name}: {within} of {measured} shapes inside the stated range ({args.device})")
        failed |= within < measured or measured == 0
    if json_path:
        from buildllm.metrics import write_metrics

        write_metrics(json_path, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
