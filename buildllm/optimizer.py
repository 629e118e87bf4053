"""AdamW with GPT-2's weight decay groups, fused where the plan found it builds (plan/fused_adamw.py)."""

from __future__ import annotations

import torch
import torch.nn as nn


def build_optimizer(model: nn.Module, learning_rate: float, weight_decay: float, fused: bool) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices and embeddings (as GPT-2 does), not on norms and biases:
    decay pulls a gain or an offset towards zero, which only distorts it."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # GPT-2's betas; fused: the plan's probe, made once per run on its device.
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95), fused=True if fused else None)
