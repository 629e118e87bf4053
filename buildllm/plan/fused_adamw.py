"""Fused AdamW, or the standard one, and why. The fused kernel updates all of AdamW's parameters in one
launch (every parameter, or with Muon the embeddings, head, norms and biases: train/optimizer.py);
not every device or build has it, so the plan runs it once on the run's device and records why it
fell back, instead of guessing from the device's name.

The probe calls AdamW's functional form, the same fused path AdamW(fused=True).step() takes, and not
the optimizer class: building any torch.optim optimizer imports torch._dynamo (about 2 s on a CPU),
which a dry run, an estimate or a preflight would pay for this probe alone.
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw


def fused_adamw_support(device: str) -> tuple[bool, str]:
    try:
        param, grad, exp_avg, exp_avg_sq = ([torch.zeros(2, device=device)] for _ in range(4))
        step = [torch.zeros((), dtype=torch.float32, device=device)]
        settings = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1, "eps": 1e-8}
        adamw(param, grad, exp_avg, exp_avg_sq, [], step, fused=True, amsgrad=False, maximize=False, **settings)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return False, f"fused AdamW does not build on {device}: {str(exc).splitlines()[0]}; using the standard AdamW"
    return True, f"fused AdamW builds on {device}"
