"""Surviving out-of-memory: recognise it, say how much memory there was, and what to do next.

The course's advice: reduce --batch-size, record the change, and rerun into a fresh checkpoint
directory (a resumed run must keep its batch size). The batch-size finder answers "how much?".
"""

from __future__ import annotations

import torch

from buildllm.errors import TrainingFailed


class OutOfMemory(TrainingFailed):
    pass


def out_of_memory(exc: BaseException) -> bool:
    # CUDA raises its own type; MPS and older builds raise a RuntimeError that says so.
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def describe_memory(figures: dict) -> str:
    """One phrase from Device.oom_figures()."""
    if not figures:
        return "no memory figures on this device"
    gib = {k: v / 2**30 for k, v in figures.items()}
    return (f"{gib['oom_allocated_bytes']:.2f} GiB allocated, {gib['oom_reserved_bytes']:.2f} GiB reserved, "
            f"peak {gib['oom_peak_allocated_bytes']:.2f} GiB of {gib['oom_device_total_bytes']:.2f} GiB")


def advice(batch_size: int) -> str:
    return (f"reduce --batch-size (e.g. --batch-size {max(1, batch_size // 2)}), record the change, and rerun into a "
            "fresh --checkpoint-directory; `buildllm benchmark --find-batch-size` finds the largest batch that fits")
