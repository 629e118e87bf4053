"""AdamW, fused where this device builds it, and the standard implementation otherwise.

The fused kernel updates all parameters in one launch; not every device or build has it, so we try
to build it and record why we fell back instead of guessing from the device name.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def fused_adamw_support(device: str) -> tuple[bool, str]:
    """(available, reason) for torch.optim.AdamW(fused=True) on `device`."""
    try:
        probe = nn.Parameter(torch.zeros(2, device=device))
        probe.grad = torch.zeros_like(probe)
        torch.optim.AdamW([probe], fused=True).step()
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return False, f"fused AdamW does not build on {device}: {str(exc).splitlines()[0]}; using the standard AdamW"
    return True, f"fused AdamW builds on {device}"


def build_optimizer(
    model: nn.Module, learning_rate: float, weight_decay: float, fused: bool, betas: tuple[float, float] = (0.9, 0.95)
) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices and embeddings (as GPT-2 does), not on norms and biases:
    decay pulls a gain or an offset towards zero, which only distorts it."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: the plan's probe (fused_adamw_support), made once per run on its device.
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=True if fused else None)
