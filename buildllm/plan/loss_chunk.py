"""How many rows the fused output layer + cross-entropy (model/fused_loss.py) computes at once: each
chunk costs a few kernels and a set of (rows x vocabulary) buffers, and the best chunk is a property
of the device, so the plan decides it (RunPlan.loss) and the model and the memory estimate read it.

- CPU: chunks whose fp32 logits fit a cache-sized CPU_CHUNK_BYTES, so the memory-bound passes over
  them (softmax, its gradient) run while the chunk is in cache.
- Accelerators: kernel launches cost, caches are small next to the logits, and a matmul wants many
  rows. The whole micro-batch runs as one chunk (the plain graph's three matmuls, with fewer
  logits-sized tensors alive) where its loss buffers fit DEVICE_MEMORY_SHARE of the device's memory;
  otherwise the largest chunks that fit, in whole ROW_MULTIPLE rows, never fewer than MIN_ROWS (on a
  small GPU the floor may pass the budget: the memory estimate counts what is chosen).

A chunk size `buildllm tune` measured faster on this machine, by a margin on the whole step (plan/tuned.py,
MIN_LOW_GAIN; the loss is about a quarter of a CPU step at iteration 1), is preferred (plan_loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

from buildllm.device.device import Device
from buildllm.model.fused_loss import chunk_bytes_per_row
from buildllm.plan.tuned import measured_count, reference_seconds, step_seconds
from buildllm.units import size

# CPU: chunk logits of at most this many bytes (fp32). Measured at iteration 1 (2048 rows,
# vocabulary 4096; scripts/fused_loss_chunks.py, forward + backward against the plain computation).
# On a quiet 2-core EPYC, 2 threads: 256 rows x1.86, 512 x1.86, 1024 x1.73, 2048 x1.36; whole train
# steps, 1024- against 512-row chunks taken in turns in one process (8 rounds of 8 steps): 512 rows
# x1.029. With the cores oversubscribed by other jobs, 1024 rows did better (512 x0.82, 1024 x1.04):
# the quiet machine is the one a benchmark is read on. 512 rows (8 MiB) also halve the chunk buffers.
CPU_CHUNK_BYTES = 8 * 2**20
# Accelerators: the loss buffers of one chunk may take this share of the device's memory: small
# next to weights, optimizer state and activations (gpt_100m at batch 64 in bf16 holds about 21 GiB
# of activations), so the largest batch that fits loses about 3% to the loss.
DEVICE_MEMORY_SHARE = 1 / 32
# A chunk's logits matmul is (rows x width) @ (width x vocabulary): 4096 rows at width 768 and
# vocabulary 16384 are 103 GFLOP, thousands of tiles, so a GPU runs it near its matmul rate, and a
# chunk's few launches (microseconds) are small against its work (0.1 ms at 1 PFLOP/s).
MIN_ROWS = 4096
# Whole tiles for the matmul kernels (multiples of 128 and 256).
ROW_MULTIPLE = 1024


@dataclass(frozen=True)
class LossDecision:
    chunk_rows: int  # rows of the output layer + cross-entropy computed at once
    rows: int  # rows of one micro-batch (batch size x sequence length)
    reason: str

    @property
    def chunks(self) -> int:  # per micro-batch
        return math.ceil(self.rows / self.chunk_rows)


def chunked(chunk: int, rows: int, why: str, buffers: str = "") -> LossDecision:
    per_batch = math.ceil(rows / chunk)
    return LossDecision(chunk, rows, f"{chunk} rows per chunk ({per_batch} per micro-batch of {rows}{buffers}): {why}")


def decide_loss(
    vocab_size: int,
    rows: int,
    precision_bytes: int,
    device: Device,
    capacity: int | None = None,
    measured_rows: int | None = None,
) -> LossDecision:
    """capacity: the device's memory (asked of the device when None; the fits table passes the sizes
    it tabulates). measured_rows: a measured best chunk size, preferred."""
    if measured_rows is not None:
        return chunked(max(1, min(rows, measured_rows)), rows, f"measured best on this machine ({measured_rows} rows)")
    if device.cache_sized_work:
        cached = f"fp32 logits of at most {CPU_CHUNK_BYTES // 2**20} MiB stay in the CPU's cache"
        chunk = max(1, min(rows, CPU_CHUNK_BYTES // (4 * vocab_size)))
        return chunked(chunk, rows, f"{cached} (measured fastest on a 2-core EPYC)")
    capacity = device.memory_capacity() if capacity is None else capacity
    per_row = chunk_bytes_per_row(vocab_size, precision_bytes)
    budget = int(capacity * DEVICE_MEMORY_SHARE)
    share = f"1/{round(1 / DEVICE_MEMORY_SHARE)} of the device's {size(capacity)}: {size(budget)}"
    if rows * per_row <= budget:
        fit = f"the micro-batch's loss buffers ({size(rows * per_row)}) fit the budget ({share})"
        return LossDecision(rows, rows, f"one chunk of {rows} rows: {fit}; computed at once, as the plain loss")
    fitting = budget // per_row // ROW_MULTIPLE * ROW_MULTIPLE
    chunk = min(rows, max(fitting, MIN_ROWS))
    why = (
        f"the most that fit the budget ({share}) in whole {ROW_MULTIPLE}-row tiles"
        if fitting >= MIN_ROWS
        else f"the floor of {MIN_ROWS} rows that keeps the matmuls large, past the budget ({share})"
    )
    return chunked(chunk, rows, why, f", {size(chunk * per_row)} of loss buffers")


def plan_loss(
    vocab_size: int,
    rows: int,
    precision_bytes: int,
    device: Device,
    record: dict | None,
    why_not: str,
    precision: str = "fp32",
) -> LossDecision:
    loss = decide_loss(vocab_size, rows, precision_bytes, device)
    measured_rows, measured_why = measured_choice(record, why_not, loss.chunk_rows, precision)
    if measured_rows is not None and measured_rows != loss.chunk_rows:
        loss = decide_loss(vocab_size, rows, precision_bytes, device, measured_rows=measured_rows)
    return replace(loss, reason=f"{loss.reason}; {measured_why}")


def measured_choice(
    record: dict | None, why_not: str, default_rows: int, precision: str = "fp32"
) -> tuple[int | None, str]:
    """(None, why) without figures for this default in this run's precision, so the plan's own rule stands."""
    figures = (record or {}).get("loss_chunk") or {}
    measured_in = figures.get("precision", "fp32")  # records from before the field: measured in fp32
    if figures and measured_in != precision:
        return None, f"measured here: rows not compared in {precision} (tune measured the loss chunk in {measured_in})"
    step = step_seconds(record) if record else None
    share = loss_share(figures, step)  # None: no step to carry it to, the kernel's own gain is judged
    judged, on = (partial(carried, share=share), " on the step") if share else (None, "")
    rows, why = measured_count(record, why_not, "loss_chunk", "default_rows", default_rows, "rows", judged, on)
    return (rows, why + step_text(figures, rows, share, step)) if share and rows else (rows, why)


def carried(figure: dict, share: float) -> dict:
    """A kernel's figure as the step's: its ratio and interval carried through on_the_step."""
    return {**figure, **{k: on_the_step(figure[k], share) for k in ("ratio", "low", "high")}}


def loss_share(figures: dict, step: float | None) -> float | None:
    """The loss's share of a training step: the fused loss at the default rows (tune's reference side)
    over the step tune timed; None without both."""
    loss = reference_seconds(figures)
    return loss / step if loss and step and loss < step else None


def on_the_step(gain: float, share: float) -> float:
    """A gain on a part that takes `share` of a step, on the whole step: the rest of it unchanged."""
    return 1 / (1 - share + share / gain)


def step_text(figures: dict, rows: int, share: float, step: float) -> str:
    """So that a kernel's x1.14 is not read as the run's: the loss's share and the gain on the step."""
    candidates = figures["candidates"]
    said = f"; the loss is {share:.0%} of a step here ({1e3 * share * step:.0f} of {1e3 * step:.0f} ms)"
    if str(rows) in candidates:
        gain = candidates[str(rows)]["ratio"]
        return f"{said}: x{gain:.2f} on it is about x{on_the_step(gain, share):.2f} on the step"
    fastest = max(candidates, key=lambda n: candidates[n]["ratio"])
    gain = candidates[fastest]["ratio"]
    return f"{said}: the fastest, {fastest} rows' x{gain:.2f}, is about x{on_the_step(gain, share):.2f} on the step"
