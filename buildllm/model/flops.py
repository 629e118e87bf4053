"""Model FLOPs per token and MFU (model FLOPs utilisation: FLOPs per token x tokens/s / peak FLOP/s).

A training step does a forward pass (2 FLOPs per weight per token for each matmul) and a backward
pass (twice that), so 6 FLOPs per matmul weight per token, plus attention's two T x T products
(QK^T and attention x V) that no weight counts: 12 * n_layer * n_embd * T per token (PaLM, appendix B).
A lookup costs nothing: the position table and an untied token table are not counted, nor are norms and biases.
Activations and norms are elementwise, a few FLOPs per value against a matmul's 2 x width per output:
ReLU squared against GELU and the qk-norm knob change nothing counted (a gated MLP's third matrix is a weight).
"""

from __future__ import annotations

import statistics

import torch.nn as nn

from buildllm.shape import GPTConfig


def matmul_parameters(model: nn.Module) -> int:
    # Lookups are not matmuls: the position table, and the token table unless it is the output layer too.
    tables = [getattr(model, "position_embedding", None), model.token_embedding]
    skip = {id(t.weight) for t in tables if t is not None and t.weight is not model.lm_head.weight}
    # parameters() yields a tied matrix once.
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in skip)


def flops_per_token(config: GPTConfig, matmul_params: int) -> int:
    attention = 12 * config.n_layer * config.n_embd * config.sequence_length
    return 6 * matmul_params + attention


def mfu(flops_per_token_: float, tokens_per_second: float, peak_flops: float) -> float:
    return flops_per_token_ * tokens_per_second / peak_flops if peak_flops > 0 else 0.0


def paired_mfu(
    flops_per_token_: float, tokens_per_step: int, steps_per_second: list[float], peaks: list[float]
) -> float:
    """The median over measured steps (or intervals) of each one's MFU against the peak measured
    beside it. A machine whose load changes within a run slows a step and the matmuls beside it
    alike, so the ratio moves less from run to run than against one peak for the whole run."""
    ratios = [mfu(flops_per_token_, rate * tokens_per_step, peak) for rate, peak in zip(steps_per_second, peaks)]
    return statistics.median(ratios) if ratios else 0.0
