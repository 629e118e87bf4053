"""How many threads torch computes with on the CPU, and why.

`threads: null` starts from torch's own count (read before any plan sets one) and keeps it unless
`buildllm tune` measured another count faster by a margin (plan/tuned.py, MIN_LOW_GAIN) on this
machine for this run's shape.
"""

from __future__ import annotations

import torch

from buildllm.plan.tuned import measured_count

DEFAULT_THREADS = torch.get_num_threads()


def decide_threads(requested: int | None, applies: bool, record: dict | None, why_not: str) -> tuple[int, str]:
    """applies: whether the device computes on the CPU's threads."""
    if requested is not None:
        return requested, f"requested: {requested}"
    if not applies:
        return DEFAULT_THREADS, f"{DEFAULT_THREADS}: torch's default for this machine"
    return measured_choice(record, why_not, DEFAULT_THREADS)


def measured_choice(record: dict | None, why_not: str, default: int) -> tuple[int, str]:
    """For `threads: null`: the count measured fastest by a margin against torch's default, else the default."""
    threads, why = measured_count(record, why_not, "threads", "default", default, "threads")
    if threads is None:
        return default, f"{default}: torch's default for this machine; {why}"
    return threads, why
