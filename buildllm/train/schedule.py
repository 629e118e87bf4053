"""The learning-rate schedule: linear warm-up, then cosine decay to a floor (min_learning_rate_ratio x peak).

Warm-up keeps the first updates small while AdamW's moment estimates are still noise. The rate is a
pure function of the step number, so a resumed run needs only the step count to continue on the same curve.
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

    def rate(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        # Steps past the plan (a benchmark running longer than the run) stay on the floor.
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        floor = self.peak * self.min_ratio
        return floor + (self.peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_schedule(peak: float, total_steps: int, warmup_steps: int | None, min_ratio: float) -> Schedule:
    """warmup_steps None: 5% of the planned steps (at least one), never more than the run has."""
    if warmup_steps is None:
        warmup_steps = max(1, round(0.05 * total_steps))
    return Schedule(peak, total_steps, min(warmup_steps, total_steps), min_ratio)
