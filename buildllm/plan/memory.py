"""Will the plan fit? The memory estimate against the memory free now, decided before anything is allocated.

The rule is `buildllm fits`' rule: a plan fits when its estimated peak stays under the free memory
less the batch finder's safety margin (benchmark.safety_margin), so the largest batch it names is
exactly the largest the check lets through. The estimate's stated range is reported beside it: a
plan whose range reaches past the free memory fits "tightly" (it may run out) and runs with a warning.

A plan that does not fit is refused by the dry run, the benchmark and train before they allocate,
unless train.force_memory (--force-memory) asks to try anyway. On the CPU running out of host memory
often ends the process without a word (the kernel's OOM killer), so saying so beforehand matters most
there. Free memory: CUDA's free memory, MPS's recommended working set, the host's available memory
capped by a container's or `ulimit`'s limit (Device.free_memory). XLA reports none: not checked.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass

from buildllm.device.device import Device
from buildllm.errors import UserError
from buildllm.memory.estimate import MemoryEstimate, estimate_training_memory, plan_memory
from buildllm.plan.loss_chunk import decide_loss
from buildllm.units import size

FITS, TIGHT, DOES_NOT_FIT, UNKNOWN = "fits", "tight", "does_not_fit", "unknown"
LARGEST = 1 << 16  # the largest batch size the bisection tries


class WontFit(UserError):
    """A plan whose estimated peak exceeds the memory free for it, refused before allocating."""


@dataclass(frozen=True)
class MemoryFit:
    verdict: str  # fits | tight | does_not_fit | unknown
    estimate_bytes: int  # the estimate's total for every process that shares this memory
    free_bytes: int  # free now for this run (0: unknown)
    usable_bytes: int  # free less the safety margin
    largest_batch_size: int  # the largest batch whose estimate fits in usable_bytes (0: not even 1)
    reason: str

    @property
    def fits(self) -> bool:
        """False only when the estimate says it cannot: a tight or unchecked plan runs."""
        return self.verdict != DOES_NOT_FIT

    def metrics(self) -> dict:
        return {
            "memory_fits": self.fits,
            "memory_verdict": self.verdict,
            "memory_free_bytes": self.free_bytes,
            "memory_usable_bytes": self.usable_bytes,
            "memory_largest_batch_size": self.largest_batch_size,
            "memory_fit_reason": self.reason,
        }


NOT_DECIDED = MemoryFit(UNKNOWN, 0, 0, 0, 0, "not decided")


def decide_memory(plan) -> MemoryFit:
    """The verdict for a RunPlan (plan/run_plan.py), from plan_memory(plan) and the device's free memory now."""
    estimate = plan_memory(plan)
    free, source = plan.device.free_memory()
    if free is None:
        return MemoryFit(UNKNOWN, estimate.total, 0, 0, 0, f"not checked: {source}")
    margin = plan.config.benchmark.safety_margin
    # torchrun's CPU processes on one machine share its memory; each GPU process has its own device.
    sharing = plan.processes if plan.device.host_memory else 1
    usable = int(free * (1 - margin))
    train = plan.config.train
    largest = largest_batch(
        plan.model,
        plan.parameters,
        plan.precision.activation_bytes,
        usable // sharing,
        plan.device,
        train.gradient_checkpointing,
        grad_accum=train.grad_accum,
    )
    total, high = estimate.total * sharing, estimate.high * sharing
    each = f" ({sharing} processes)" if sharing > 1 else ""
    figures = (
        f"estimated peak {size(total)}{each} (range {size(estimate.low * sharing)}-{size(high)}), "
        f"{size(free)} {source}, {size(usable)} usable with the {margin:.0%} safety margin"
    )
    if total > usable:
        verdict, reason = DOES_NOT_FIT, f"does not fit: {figures}"
    elif high > free:
        verdict, reason = TIGHT, f"may not fit: {figures}; the estimate's range reaches past the free memory"
    else:
        verdict, reason = FITS, f"fits: {figures}"
    return MemoryFit(verdict, total, free, usable, largest, reason)


def suggestion(fit: MemoryFit) -> str:
    if fit.largest_batch_size:
        return f"the largest batch that fits is {fit.largest_batch_size}: use --batch-size {fit.largest_batch_size}"
    return "not even batch size 1 fits: use a smaller profile or --gradient-checkpointing"


def refuse_unless_fits(plan) -> None:
    """Stop a plan that cannot fit, before anything is allocated (--force-memory: warn and go on)."""
    fit = plan.memory
    if fit.fits:
        if fit.verdict == TIGHT:
            print(f"warning: this plan {fit.reason}", file=sys.stderr, flush=True)
        return
    if not plan.config.train.force_memory:
        raise WontFit(f"this plan {fit.reason}; {suggestion(fit)}, or --force-memory to try anyway")
    print(f"warning: this plan {fit.reason}; trying anyway (--force-memory)", file=sys.stderr, flush=True)


def estimate_at(
    model,
    parameters: int,
    batch: int,
    precision_bytes: int,
    device: Device,
    capacity: int,
    gradient_checkpointing: bool = False,
    grad_accum: int = 1,
) -> MemoryEstimate:
    """The estimate a plan of `batch` would make on a device of `capacity` bytes: the fused loss's
    chunks sized by the plan's own rule (buildllm/plan/loss_chunk.py) for that batch and memory."""
    loss = decide_loss(model.vocab_size, batch * model.sequence_length, precision_bytes, device, capacity)
    return estimate_training_memory(
        model,
        parameters,
        batch,
        precision_bytes,
        device,
        gradient_checkpointing,
        grad_accum,
        loss_chunk_rows=loss.chunk_rows,
    )


def largest_batch(
    model,
    parameters: int,
    precision_bytes: int,
    usable: int,
    device: Device,
    gradient_checkpointing: bool = False,
    capacity: int | None = None,
    grad_accum: int = 1,
) -> int:
    """The largest batch size whose estimate fits in `usable` bytes; 0 when not even one fits.
    capacity: the device's memory (`usable` when not given), which sizes the fused loss's chunks."""

    def fits(batch: int) -> bool:
        estimate = estimate_at(
            model, parameters, batch, precision_bytes, device, capacity or usable, gradient_checkpointing, grad_accum
        )
        return estimate.total <= usable

    # fits() holds for every batch up to the answer and for none above it: bisect finds the first
    # batch of 1..LARGEST that does not fit, and the count of those before it is the answer.
    return bisect.bisect_left(range(1, LARGEST + 1), True, key=lambda batch: not fits(batch))
