"""A training step written plainly, to measure the product's step against (`buildllm verify speed`).

The same model (built from the plan's shape and seed, with its loss chunk, checkpointing and compile
decision), the same batch size and precision, and nothing else: forward under autocast, the loss,
backward, clipping, the recipe's optimizer (fused AdamW, with Muon on the hidden matrices under the
muon recipe: the same update math as the run, so that the comparison measures what surrounds it),
zero_grad. Its batches are the product's first batches, made and
put on the device before any step is timed, then reused in turn: a bare step pays nothing for data.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from buildllm.data.windows import RunBatches, Windows
from buildllm.model.gpt import build_model
from buildllm.train.optimizer import plan_optimizers

BATCHES = 8  # distinct batches taken in turn: more would only hold more device memory


def bare_step(plan, windows: Windows):
    """A function that runs one optimizer step of `plan` and returns its loss (a 0-d device tensor)."""
    cfg, device = plan.config.train, plan.device
    model = build_model(plan.model, device.device, seed=plan.config.seed)
    model.loss_chunk_rows = plan.loss.chunk_rows
    model.gradient_checkpointing = cfg.gradient_checkpointing
    forward = torch.compile(model) if plan.compile.enabled else model
    optimizer = plan_optimizers(model, plan)
    # The batches the product's data cursor starts with (epoch 0's order), already on the device.
    first = itertools.islice(RunBatches(windows, plan.batch_size, plan.config.seed, 0), BATCHES)
    batches = itertools.cycle([tuple(pair.to(device.device)) for _, _, pair in first])
    dtype = plan.precision.autocast_dtype
    scaler = torch.amp.GradScaler(device.kind) if dtype == torch.float16 else None  # fp16 gradients underflow
    accum = cfg.grad_accum

    def step() -> torch.Tensor:
        total = None
        for _ in range(accum):
            inputs, targets = next(batches)
            context = torch.autocast(device.autocast_type, dtype=dtype) if dtype else contextlib.nullcontext()
            with context:
                _, loss = forward(inputs, targets)
            (scaler.scale(loss / accum) if scaler else loss / accum).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if scaler:
            scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / accum

    return step
