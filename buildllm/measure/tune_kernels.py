"""The parts of `buildllm tune` that time one kernel rather than the Trainer's step: the fused loss's
chunk and attention (measure/tune.py says what each compares, and what is decided from it)."""

from __future__ import annotations

import contextlib
import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from buildllm.measure.stats import compare
from buildllm.measure.tune_budget import NO_TIME, Budget
from buildllm.model import fused_loss
from buildllm.plan.loss_chunk import decide_loss
from buildllm.plan.run_plan import RunPlan


def measure_chunks(plan: RunPlan, budget: Budget, skipped: list) -> dict:
    """The fused loss forward + backward at one micro-batch's rows, per chunk size (rows per chunk):
    the default against half, double and four times as many, and against the plain computation."""
    m, device = plan.model, plan.device
    rows = plan.batch_size * m.sequence_length
    # The plan's own rule, not a size an earlier tune chose: what the tune record is compared against.
    default_rows = decide_loss(m.vocab_size, rows, 4, device).chunk_rows
    options = sorted(
        {r for r in (default_rows // 2, 2 * default_rows, 4 * default_rows) if 1 <= r <= rows} - {default_rows}
    )
    if not options:
        return {"default_rows": default_rows, "skipped": f"one chunk holds the whole micro-batch of {rows} rows"}
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, m.n_embd, generator=generator).to(device.device).requires_grad_()
    weight = (0.02 * torch.randn(m.vocab_size, m.n_embd, generator=generator)).to(device.device).requires_grad_()
    targets = torch.randint(m.vocab_size, (rows,), generator=generator).to(device.device)

    def run(chunk_rows: int | None) -> None:  # None: the plain computation, all logits at once
        if chunk_rows is None:
            fused_loss.plain_linear_cross_entropy(x, weight, targets).backward()
        else:
            fused_loss.linear_cross_entropy(x, weight, targets, chunk_rows).backward()
        x.grad = weight.grad = None

    turns = {str(r): partial(run, r) for r in [default_rows, *options]} | {"plain": partial(run, None)}
    seconds = budget.take_turns("loss_chunk", turns, skipped)
    if seconds is None:
        return {"default_rows": default_rows, "skipped": NO_TIME}
    figures = compare(seconds, str(default_rows))
    return {
        "default_rows": default_rows,
        "rows": rows,
        "precision": "fp32",
        "plain": figures.pop("plain", None),
        "candidates": figures,
    }


def explicit_attention(q, k, v, causal):
    """Attention as a learner writes it: scores, the causal mask, softmax, the weighted values."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v


def measure_attention(plan: RunPlan, budget: Budget, skipped: list) -> dict:
    m, device = plan.model, plan.device
    generator = torch.Generator().manual_seed(0)
    shape = (plan.batch_size, m.n_head, m.sequence_length, m.head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(device.device).requires_grad_() for _ in range(3))
    causal = torch.ones(m.sequence_length, m.sequence_length, dtype=torch.bool, device=device.device).tril()

    def run(backend) -> None:
        if backend == "explicit":
            explicit_attention(q, k, v, causal).sum().backward()
        else:
            with sdpa_kernel(backend) if backend else contextlib.nullcontext():
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        q.grad = k.grad = v.grad = None

    turns = {
        "dispatch": partial(run, None),
        "math": partial(run, SDPBackend.MATH),
        "explicit": partial(run, "explicit"),
    }
    seconds = budget.take_turns("attention", turns, skipped)
    if seconds is None:
        return {"skipped": NO_TIME}
    return {
        "reference": "dispatch",
        "decides": "nothing: torch's dispatch picks the kernel",
        **compare(seconds, "dispatch"),
    }
