"""How many threads torch computes with on the CPU, and why.

`threads: null` starts from torch's own count (read before any plan sets one) and keeps it unless
`buildllm tune` measured another count conclusively faster on this machine for this run's shape.
"""

from __future__ import annotations

import torch

from buildllm.plan.tuned import fastest

# torch's own thread count, read at import, before any plan sets one.
DEFAULT_THREADS = torch.get_num_threads()


def decide_threads(requested: int | None, applies: bool, record: dict | None, why_not: str) -> tuple[int, str]:
    """applies: whether the device computes on the CPU's threads."""
    if requested is not None:
        return requested, f"requested: {requested}"
    if not applies:
        return DEFAULT_THREADS, f"{DEFAULT_THREADS}: torch's default for this machine"
    return measured_choice(record, why_not, DEFAULT_THREADS)


def measured_choice(record: dict | None, why_not: str, default: int) -> tuple[int, str]:
    """For `threads: null`: the count measured conclusively fastest against torch's default, else the default."""
    if record is None:
        return default, f"{default}: torch's default for this machine; {why_not}"
    figures = record.get("threads")
    if not figures or "skipped" in figures or figures.get("default") != default:
        skipped = (figures or {}).get("skipped", "measured with another default")
        return default, f"{default}: torch's default for this machine; measured here: threads not compared ({skipped})"
    others = {int(n): f for n, f in figures.get("candidates", {}).items()}
    if not others:
        return default, f"{default}: torch's default; measured here: no other thread count to compare"
    best, said = fastest(others, "threads")
    if best is not None:
        return best, f"{best}: measured here against torch's default {default}: {said}"
    return default, f"{default}: torch's default, kept; measured here against it: {said}"
