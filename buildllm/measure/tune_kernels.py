"""The parts of `buildllm tune` that time one kernel rather than the Trainer's step: the fused loss's
chunk and attention (measure/tune.py says what each compares, and what is decided from it). Both run
in the plan's precision, under its autocast, as the model's step runs them: `plan` is the run's plan
in the precision tune found it will use (measure/tune_order.py)."""

from __future__ import annotations

import contextlib
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from buildllm.device.precision import autocast
from buildllm.measure.stats import compare
from buildllm.measure.tune_budget import NO_TIME, Budget
from buildllm.model import fused_loss
from buildllm.model.gpt import explicit_attention
from buildllm.plan.loss_chunk import decide_loss
from buildllm.plan.run_plan import RunPlan


def measure_chunks(plan: RunPlan, budget: Budget, skipped: list) -> dict:
    """The fused loss forward + backward at one micro-batch's rows, per chunk size (rows per chunk):
    the default against half, double and four times as many, and against the plain computation."""
    m, device, precision = plan.model, plan.device, plan.precision
    rows = plan.batch_size * m.sequence_length
    # The plan's own rule in the run's precision, not a size an earlier tune chose: what the tune
    # record is compared against (on a GPU the default depends on the precision's buffer sizes).
    default_rows = decide_loss(m.vocab_size, rows, precision.activation_bytes, device).chunk_rows
    options = sorted(
        {r for r in (default_rows // 2, 2 * default_rows, 4 * default_rows) if 1 <= r <= rows} - {default_rows}
    )
    if not options:
        why = f"one chunk holds the whole micro-batch of {rows} rows"
        return {"default_rows": default_rows, "precision": precision.precision, "skipped": why}
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, m.n_embd, generator=generator).to(device.device).requires_grad_()
    weight = (0.02 * torch.randn(m.vocab_size, m.n_embd, generator=generator)).to(device.device).requires_grad_()
    targets = torch.randint(m.vocab_size, (rows,), generator=generator).to(device.device)

    def run(chunk_rows: int | None) -> None:  # None: the plain computation, all logits at once
        with autocast(precision, device):
            if chunk_rows is None:
                loss = fused_loss.plain_linear_cross_entropy(x, weight, targets)
            else:
                loss = fused_loss.linear_cross_entropy(x, weight, targets, chunk_rows)
        loss.backward()
        x.grad = weight.grad = None

    turns = {str(r): partial(run, r) for r in [default_rows, *options]} | {"plain": partial(run, None)}
    seconds = budget.take_turns("loss_chunk", turns, skipped)
    if seconds is None:
        return {"default_rows": default_rows, "precision": precision.precision, "skipped": NO_TIME}
    figures = compare(seconds, str(default_rows))
    return {
        "default_rows": default_rows,
        "rows": rows,
        "precision": precision.precision,
        "plain": figures.pop("plain", None),
        "candidates": figures,
    }


# The backends torch.nn.attention.sdpa_kernel offers, each forced alone; a device or shape that
# has no kernel for one (the CPU has no cuDNN or memory-efficient kernel) is recorded as not offered.
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def measure_attention(plan: RunPlan, budget: Budget, skipped: list, part: float = 1.0) -> dict:
    """Attention forward + backward at the run's shape and precision: torch's dispatch (what the model
    calls) against each backend forced alone and against the explicit matmul-softmax."""
    m, device, precision = plan.model, plan.device, plan.precision
    generator = torch.Generator().manual_seed(0)
    shape = (plan.batch_size, m.n_head, m.sequence_length, m.head_dim)
    # q, k and v come out of the qkv matmul in the compute dtype, as in the model's step.
    dtype = precision.autocast_dtype or torch.float32
    q, k, v = (torch.randn(shape, generator=generator).to(device.device, dtype).requires_grad_() for _ in range(3))

    def run(backend) -> None:
        with autocast(precision, device):
            if backend == "explicit":
                out = explicit_attention(q, k, v)  # the model's own written-out form
            else:
                with sdpa_kernel(BACKENDS[backend]) if backend != "dispatch" else contextlib.nullcontext():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    not_offered = {}
    for name in BACKENDS:
        try:
            run(name)  # untimed: whether this device offers it for this shape and dtype
        except RuntimeError as exc:
            not_offered[name] = str(exc).strip().splitlines()[0][:160]
    sides = ["dispatch", *(name for name in BACKENDS if name not in not_offered), "explicit"]
    seconds = budget.take_turns("attention", {name: partial(run, name) for name in sides}, skipped, part=part)
    said = {"precision": precision.precision, "not_offered": not_offered}
    if seconds is None:
        return {**said, "skipped": NO_TIME}
    return {
        "reference": "dispatch",
        "decides": "the attention: written out where conclusively faster than the dispatch (plan/attention.py)",
        **said,
        **compare(seconds, "dispatch"),
    }
