"""Whether to torch.compile the model: `train.compile` true, false, or auto from measurement.

torch.compile costs seconds to minutes before the first step and then may or may not make each step
faster; on a small CPU model it often does not. `auto` compiles only where a measurement of this
profile on this kind of device (compile_measurements.yaml, written by scripts/compile_gain.py) shows
that the time saved per step pays back the compile time within the steps this run plans. Every
answer carries its reason, with the figures and their source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import yaml


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    reason: str


def measurements() -> dict:
    path = resources.files("buildllm") / "compile_measurements.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def decide_compile(setting: str, profile: str, device_kind: str, planned_steps: int | None,
                   shape_is_profiles: bool = True, precision: str = "fp32", figures: dict | None = None
                   ) -> CompileDecision:
    """The decision for one run (made by the plan). A measurement applies to its profile's default
    shape and batch, in the precision it was taken in, on that device kind only. planned_steps None
    (before the data is counted) states the break-even step count instead of a decision against it."""
    if setting in ("true", "false"):
        return CompileDecision(setting == "true", f"train.compile: {setting}")
    figures = measurements() if figures is None else figures
    measured = figures.get(profile, {}).get(device_kind)
    if measured is None:
        return CompileDecision(False, f"auto: not compiling; torch.compile was never measured for profile {profile} "
                                      f"on {device_kind} (scripts/compile_gain.py measures it)")
    if not shape_is_profiles or precision != measured.get("precision", "fp32"):
        return CompileDecision(False, f"auto: not compiling; the measurement of profile {profile} on {device_kind} "
                                      "is for its default shape, batch and precision, and this run changes them")
    speedup, seconds, step = measured["speedup"], measured["compile_seconds"], measured["plain_step_seconds"]
    figures_text = (f"measured x{speedup:.2f} per step after {seconds:.0f} s of compilation "
                    f"at {step * 1000:.0f} ms/step ({measured['source']})")
    if speedup <= 1.0:
        return CompileDecision(False, f"auto: not compiling; {figures_text}: no gain to pay it back")
    saved_per_step = step * (1.0 - 1.0 / speedup)
    break_even = math.ceil(seconds / saved_per_step)
    if planned_steps is None:
        return CompileDecision(False, f"auto: compiles if the run plans at least {break_even} steps; {figures_text}")
    enabled = planned_steps >= break_even
    verdict = "compiling" if enabled else "not compiling"
    return CompileDecision(enabled, f"auto: {verdict}; pays back after {break_even} steps and this run plans "
                                    f"{planned_steps}; {figures_text}")
