"""Where a real training run's time fell against the estimate of the same plan (metrics/estimate.json).

The train metrics record it (inside / below / above the estimate's range, and actual ÷ estimated),
so a run that the estimate did not foresee says so; `buildllm verify estimate` judges the same
figures. The run's time is its process's wall clock from interpreter start to the metrics file,
which is what the estimate projects: start-up, steps, validation passes, checkpoint saves, the plot.
"""

from __future__ import annotations

import time

import psutil

from buildllm.errors import UserError
from buildllm.metrics import read_metrics
from buildllm.paths import metrics_path

# What the estimate and the run must share for one to be judged against the other.
SAME_PLAN = ("profile", "device", "precision", "batch_size", "grad_accum")


def same_plan(estimate: dict, run: dict) -> bool:
    steps = estimate.get("planned_optimizer_steps") == run.get("planned_steps")
    return steps and all(estimate.get(key) == run.get(key) for key in SAME_PLAN)


def position(estimate: dict, seconds: float) -> dict:
    low, high = estimate["estimated_seconds_low"], estimate["estimated_seconds_high"]
    where = "below" if seconds < low else "above" if seconds > high else "inside"
    return {
        "run_seconds": seconds,
        "estimated_seconds": estimate["estimated_seconds"],
        "estimated_seconds_low": low,
        "estimated_seconds_high": high,
        "estimate_position": where,
        "estimate_ratio": seconds / estimate["estimated_seconds"],
    }


def against_estimate(run: dict) -> dict:
    """The position of a completed, unresumed run against metrics/estimate.json, when that file
    estimated this very plan; {} otherwise (no estimate, another plan, a resumed run)."""
    if run.get("status") != "completed" or run.get("resumed"):
        return {}
    try:
        estimate = read_metrics(metrics_path("estimate"))
    except (UserError, OSError):  # none, or not a metrics file
        return {}
    if not same_plan(estimate, run) or "estimated_seconds_low" not in estimate:
        return {}
    return position(estimate, time.time() - psutil.Process().create_time())


def describe(figures: dict) -> str:
    return (
        f"took {figures['run_seconds']:.1f} s against the estimate's {figures['estimated_seconds']:.1f} s "
        f"(x{figures['estimate_ratio']:.2f}; range {figures['estimated_seconds_low']:.1f}-"
        f"{figures['estimated_seconds_high']:.1f} s): {figures['estimate_position']}"
    )
