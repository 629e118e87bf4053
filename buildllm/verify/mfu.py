"""`buildllm verify mfu`: the same benchmark run in fresh processes gives the same MFU.

Each run's MFU must lie within --tolerance of every other's: a figure that moved with the machine's
load would not. The runs' speeds are printed too: their spread is the run-to-run variation the
estimate's range allows for (predict/estimate.py).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from buildllm.config import load_config
from buildllm.errors import UserError
from buildllm.verify.harness import add_plan_arguments, finish, machine, plan_overrides

TOLERANCE = 0.03
FULL_BENCHMARK = {"benchmark.measured_steps": 60, "benchmark.intervals": 12}


def add_arguments(parser) -> None:
    parser.add_argument("--full", action="store_true", help="four runs of a longer benchmark (60 steps, 12 intervals)")
    parser.add_argument("--runs", type=int, metavar="N", help="fresh benchmark processes (default 2; 4 with --full)")
    add_plan_arguments(parser)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        metavar="F",
        help=f"highest MFU ÷ lowest - 1 allowed (default {TOLERANCE})",
    )


def command(args) -> int:
    from buildllm.measure.benchmark import mfu_from_metrics
    from buildllm.measure.workfolder import prepare, run_benchmark

    runs = args.runs or (4 if args.full else 2)
    if runs < 2:
        raise UserError(f"--runs {runs}: give at least 2 (the check compares runs with each other)")
    config = load_config(args.params, plan_overrides(args, FULL_BENCHMARK if args.full else {}))
    print(
        f"{'run':>4}{'tokens/s':>12}{'steps/s':>9}{'achieved TFLOP/s':>18}{'peak TFLOP/s':>14}{'before':>8}"
        f"{'after':>8}{'MFU':>8}  peak source",
        flush=True,
    )
    mfus, speeds, record, misses = [], [], {}, 0
    for number in range(1, runs + 1):
        with tempfile.TemporaryDirectory(prefix="buildllm-verify-mfu-") as tmp:
            folder = prepare(Path(tmp) / "run", config)
            m = run_benchmark(folder, f"verify mfu, run {number}", timeout=3600)
        # Recomputed from the file alone, as a reader of the metrics would.
        recomputed = mfu_from_metrics(m)
        if abs(recomputed - m["mfu"]) > 1e-9 * max(m["mfu"], 1):
            print(f"run {number}: MFU {m['mfu']} is not what its own file gives ({recomputed})")
            misses += 1
        mfus.append(m["mfu"])
        speeds.append(m["steps_per_second"])
        record.update({f"run_{number}_{key}": m[key] for key in ("mfu", "steps_per_second", "throughput_cv")})
        print(
            f"{number:>4}{m['tokens_per_second']:>12,.0f}{m['steps_per_second']:>9.2f}"
            f"{m['achieved_flops'] / 1e12:>18.4f}{m['peak_flops'] / 1e12:>14.4f}{m['peak_flops_before'] / 1e12:>8.3f}"
            f"{m['peak_flops_after'] / 1e12:>8.3f}{m['mfu']:>8.2%}  {m['peak_flops_source']}",
            flush=True,
        )
    spread = max(mfus) / min(mfus) - 1
    speed_spread = max(abs(s / statistics.median(speeds) - 1) for s in speeds)
    inside = spread <= args.tolerance
    misses += not inside
    print(
        f"{runs} runs of {m['profile']} on {m['device']} ({m['precision']}): MFU median "
        f"{statistics.median(mfus):.2%}, highest ÷ lowest - 1 = {spread:.2%}, "
        f"{'inside' if inside else 'OUTSIDE'} the ±{args.tolerance:.0%} range; "
        f"steps/s up to {speed_spread:.1%} from the runs' median",
        flush=True,
    )
    record.update(
        {
            **{key: m[key] for key in ("profile", "device", "precision")},
            "runs": runs,
            "mfu_median": statistics.median(mfus),
            "mfu_spread": spread,
            "tolerance": args.tolerance,
            "steps_per_second_spread": speed_spread,
            "full": args.full,
            **machine(),
        }
    )
    return finish("mfu", args.out, record, misses, runs)
