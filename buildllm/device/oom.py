"""Surviving out-of-memory: recognise it, say how much memory there was, and what to do next (the
course's advice: reduce --batch-size into a fresh checkpoint directory, as a resumed run must keep its
batch size). On the CPU a failure raises only where malloc fails (a `ulimit -v`, a container limit);
with overcommit the kernel's OOM killer ends the process instead, hence plan/memory.py's check."""

from __future__ import annotations

import torch

from buildllm.errors import TrainingFailed


class OutOfMemory(TrainingFailed):
    pass


# CUDA's and MPS's "out of memory"; the CPU allocator's "can't allocate memory", and errno 12's text.
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> bool:
    # CUDA raises its own type; MPS, the CPU and older builds raise a RuntimeError that says so; Python's
    # own allocations (and numpy's) raise MemoryError.
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(words in str(exc).lower() for words in OOM_MESSAGES)


def describe_memory(figures: dict) -> str:
    if not figures:
        return "no memory figures on this device"
    gib = {k: v / 2**30 for k, v in figures.items()}
    if "oom_resident_bytes" in figures:  # the CPU
        return f"the process held {gib['oom_resident_bytes']:.2f} GiB, {gib['oom_free_bytes']:.2f} GiB was still free"
    return (
        f"{gib['oom_allocated_bytes']:.2f} GiB allocated, {gib['oom_reserved_bytes']:.2f} GiB reserved, "
        f"peak {gib['oom_peak_allocated_bytes']:.2f} GiB of {gib['oom_device_total_bytes']:.2f} GiB"
    )


def advice(batch_size: int) -> str:
    return (
        f"reduce --batch-size (e.g. --batch-size {max(1, batch_size // 2)}), record the change, and rerun into a "
        "fresh --checkpoint-directory; `buildllm benchmark --find-batch-size` finds the largest batch that fits"
    )
