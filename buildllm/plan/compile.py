"""Whether to torch.compile the model: `train.compile` true, false, or auto from this machine's figures.

torch.compile costs seconds to minutes before the first step and then may or may not make each step
faster; on a small CPU model it often does not. `auto` compiles only where `buildllm tune` measured
each step conclusively faster for this run's profile, shape and batch, and the time saved per step,
at the low end of the speed-up's interval, pays back the compile time within the steps this run plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from buildllm.plan.tuned import faster


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    reason: str


def decide_compile(
    setting: str, planned_steps: int | None, precision: str = "fp32", measured: dict | None = None, missing: str = ""
) -> CompileDecision:
    """`measured`: tune's compile figures for this run (compile_figures), or None with `missing` saying
    why there are none. planned_steps None (before the data is counted) states the break-even step
    count instead of a decision against it."""
    if setting in ("true", "false"):
        return CompileDecision(setting == "true", f"train.compile: {setting}")
    if measured is None:
        return CompileDecision(False, f"auto: not compiling; {missing}")
    if precision != (measured_in := measured.get("precision", "fp32")):
        why = f"torch.compile was measured here in {measured_in} and this run computes in {precision}"
        return CompileDecision(False, f"auto: not compiling; {why}")
    speedup, seconds, step = measured["speedup"], measured["compile_seconds"], measured["plain_step_seconds"]
    figures_text = (
        f"measured here: x{speedup:.2f} per step ({measured.get('pairs', 0)} pairs) after "
        f"{seconds:.0f} s of compilation at {step * 1000:.0f} ms/step"
    )
    if speedup <= 1.0:
        return CompileDecision(False, f"auto: not compiling; {figures_text}: no gain to pay it back")
    if not faster(measured):
        interval = f"(interval {measured['low']:.2f}-{measured['high']:.2f})"
        return CompileDecision(False, f"auto: not compiling; {figures_text}: not conclusively faster {interval}")
    # Paid back at the interval's low end, not its median: a run planned at the median's break-even wins
    # nothing half the time. The default run compiled at 493 break-even steps of its 500 (x1.08, low
    # end x1.06, 155 ms compiled against 170 ms plain in tune) and trained at 192 ms a step: a miss.
    saved_per_step = step * (1.0 - 1.0 / measured["low"])
    break_even = math.ceil(max(seconds, 0.0) / saved_per_step)
    figures_text += f", x{measured['low']:.2f} at its interval's low end"
    if planned_steps is None:
        return CompileDecision(False, f"auto: compiles if the run plans at least {break_even} steps; {figures_text}")
    enabled = planned_steps >= break_even
    verdict = "compiling" if enabled else "not compiling"
    pays = f"pays back after {break_even} steps and this run plans {planned_steps}"
    return CompileDecision(enabled, f"auto: {verdict}; {pays}; {figures_text}")


def compile_figures(record: dict | None, why_not: str) -> tuple[dict | None, str]:
    if record is None:
        return None, why_not
    figures = record.get("compile", {})
    if "speedup" not in figures:
        return None, f"measured here: torch.compile {figures.get('skipped', 'not measured')}"
    return figures, ""
