"""Will the plan fit? The memory estimate against the memory free now, decided before anything is allocated.

A plan fits when its estimated peak stays under the free memory (Device.free_memory) less the batch
finder's safety margin, so the largest batch `buildllm fits` names is exactly the largest this check
lets through; a plan whose stated range reaches past the free memory is "tight" and runs with a
warning. One that does not fit is refused before it allocates (unless --force-memory): on the CPU
running out of host memory often ends the process without a word (the kernel's OOM killer).
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass

from buildllm.device.device import Device
from buildllm.errors import UserError
from buildllm.memory.estimate import MemoryEstimate, estimate_training_memory, plan_memory, saves_before_last_step
from buildllm.plan.loss_chunk import decide_loss
from buildllm.units import size

FITS, TIGHT, DOES_NOT_FIT, UNKNOWN = "fits", "tight", "does_not_fit", "unknown"
LARGEST = 1 << 16  # the largest batch size the bisection tries


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
        muon_parameters=plan.muon_parameters,
        explicit_attention=plan.attention.explicit,
        saves_while_training=saves_before_last_step(plan),
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


def refuse_unless_fits(plan) -> None:
    fit = plan.memory
    if fit.fits:
        if fit.verdict == TIGHT:
            print(f"warning: this plan {fit.reason}", file=sys.stderr, flush=True)
        return
    if not plan.config.train.force_memory:
        largest = fit.largest_batch_size
        suggestion = (
            f"the largest batch that fits is {largest}: use --batch-size {largest}"
            if largest
            else "not even batch size 1 fits: use a smaller profile or --gradient-checkpointing"
        )
        raise UserError(f"this plan {fit.reason}; {suggestion}, or --force-memory to try anyway")
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
    muon_parameters: int = 0,
    explicit_attention: bool = False,
    saves_while_training: bool = False,
) -> MemoryEstimate:
    """The estimate a plan of `batch` would make on a device of `capacity` bytes: the fused loss's
    chunks sized by the plan's own rule (buildllm/plan/loss_chunk.py) for that batch and memory."""
    chunk = decide_loss(model.vocab_size, batch * model.sequence_length, precision_bytes, device, capacity).chunk_rows
    return estimate_training_memory(
        model,
        parameters,
        batch,
        precision_bytes,
        device,
        gradient_checkpointing,
        grad_accum,
        loss_chunk_rows=chunk,
        muon_parameters=muon_parameters,
        explicit_attention=explicit_attention,
        saves_while_training=saves_while_training,
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
    muon_parameters: int = 0,
    explicit_attention: bool = False,
    saves_while_training: bool = False,
) -> int:
    """The largest batch size whose estimate fits in `usable` bytes; 0 when not even one fits.
    capacity: the device's memory (`usable` when not given), which sizes the fused loss's chunks."""

    def fits(batch: int) -> bool:
        estimate = estimate_at(
            model,
            parameters,
            batch,
            precision_bytes,
            device,
            capacity or usable,
            gradient_checkpointing,
            grad_accum,
            muon_parameters,
            explicit_attention,
            saves_while_training,
        )
        return estimate.total <= usable

    # fits() holds for every batch up to the answer and for none above it: bisect finds the first
    # batch of 1..LARGEST that does not fit, and the count of those before it is the answer.
    return bisect.bisect_left(range(1, LARGEST + 1), True, key=lambda batch: not fits(batch))
