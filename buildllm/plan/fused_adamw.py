"""Fused AdamW, or the standard one, and why.

The fused kernel updates all parameters in one launch; not every device or build has it, so the plan
builds it once on the run's device and records why it fell back, instead of guessing from the
device's name. The trainer builds its optimizer from this answer (train/trainer.py).
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
