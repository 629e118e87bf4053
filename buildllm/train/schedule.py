"""The learning-rate schedule: linear warm-up, then the decay to a floor (min_learning_rate_ratio x peak),
either cosine over every step after the warm-up, or wsd: warm-up, stable at the peak, then a linear
decay over the last decay_fraction of the steps (buildllm/plan/recipe.py says why each).

Warm-up keeps the first updates small while the optimizers' moment estimates are still noise. The
rate is a pure function of the step number, so a resumed run needs only the step count to continue
on the same curve. factor() is the rate as a share of the peak: with two optimizers, each group's
rate is its own peak times the same factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    peak: float
    total_steps: int
    warmup_steps: int
    min_ratio: float
    kind: str = "cosine"
    decay_steps: int = 0  # wsd: the steps of the final linear decay

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "wsd":
            decay_start = self.total_steps - self.decay_steps
            if step < decay_start:
                return 1.0
            # Steps past the plan (a benchmark running longer than the run) stay on the floor.
            progress = min(1.0, (step - decay_start + 1) / max(1, self.decay_steps))
            return 1.0 - (1.0 - self.min_ratio) * progress
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def rate(self, step: int) -> float:
        return self.peak * self.factor(step)


def make_schedule(
    peak: float,
    total_steps: int,
    warmup_steps: int | None,
    min_ratio: float,
    kind: str = "cosine",
    decay_fraction: float | None = None,
) -> Schedule:
    """warmup_steps None: 5% of the planned steps (at least one), never more than the run has. wsd's
    decay takes decay_fraction of the steps, never those of the warm-up."""
    if warmup_steps is None:
        warmup_steps = max(1, round(0.05 * total_steps))
    warmup_steps = min(warmup_steps, total_steps)
    decay_steps = 0
    if kind == "wsd":
        decay_steps = min(total_steps - warmup_steps, round((decay_fraction or 0.0) * total_steps))
    return Schedule(peak, total_steps, warmup_steps, min_ratio, kind, decay_steps)
