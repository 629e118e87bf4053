"""Which parameters each optimizer takes: a decision of the plan (its startup line and metrics name
the groups), made on the meta-device model before anything is allocated, and the one the Trainer's
optimizers (train/optimizer.py) are built from.

Muon only means something for a matrix that maps one hidden vector to another: the blocks' linear
layers. Embeddings, the output head (tied to the embedding at iteration 1), norms' gains and biases
stay with AdamW.
"""

from __future__ import annotations

import re

import torch


def is_hidden_matrix(name: str, parameter: torch.Tensor) -> bool:
    """Muon's parameters: the 2-D weights inside the transformer blocks (named blocks.N....)."""
    return name.startswith("blocks.") and parameter.dim() == 2


def split_parameters(model: torch.nn.Module, optimizer: str) -> dict[str, list[tuple[str, torch.Tensor]]]:
    """{group name: [(parameter name, parameter)]}, each parameter once (a tied head is the embedding).

    Groups: muon (hidden matrices, with muon), adamw_decay (other matrices and embeddings: weight decay,
    as GPT-2 does), adamw_no_decay (norms and biases: decay would pull a gain or an offset to zero)."""
    groups: dict[str, list] = {"muon": [], "adamw_decay": [], "adamw_no_decay": []}
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        if not p.requires_grad:
            continue
        if optimizer == "muon" and is_hidden_matrix(name, p):
            groups["muon"].append((name, p))
        else:
            groups["adamw_decay" if p.dim() >= 2 else "adamw_no_decay"].append((name, p))
    return {key: value for key, value in groups.items() if value}


def describe(groups: dict) -> str:
    """One line for the startup line and the metrics' notes: per group, its parameters, tensors and
    their names (a block's names once, its index as N)."""
    parts = []
    for key, params in groups.items():
        names = list(dict.fromkeys(re.sub(r"^blocks\.\d+\.", "blocks.N.", n) for n, _ in params))
        count = sum(p.numel() for _, p in params)
        parts.append(f"{key}: {count:,} parameters in {len(params)} tensors ({', '.join(names)})")
    return "; ".join(parts)
