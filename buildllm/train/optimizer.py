"""The run's optimizer: AdamW on every parameter, or Muon on the hidden 2-D weights and AdamW on the rest.

Muon orthogonalises each weight matrix's momentum (torch.optim.Muon: Newton-Schulz iterations), which
only means something for a matrix that maps one hidden vector to another: the blocks' linear layers.
Embeddings (a lookup table: one row per token, not a map), the output head (tied to the embedding at
iteration 1), norms' gains and biases stay with AdamW, as in the modded-nanogpt speedrun and
Moonshot's Muon. `Optimizers` steps both as one: the Trainer, the grad scaler and checkpoints see one
object with every parameter group.
"""

from __future__ import annotations

import torch

from buildllm.plan.optimizer_groups import split_parameters

# GPT-2's betas, for AdamW whichever recipe.
ADAMW_BETAS = (0.9, 0.95)
# torch.optim.Muon's update scaled to AdamW's RMS (0.2 x sqrt(max(rows, columns))): one learning-rate
# scale for both optimizers, and the learning rates an AdamW run found carry over.
MUON_ADJUST_LR = "match_rms_adamw"


class Optimizers:
    """AdamW alone, or Muon and AdamW stepped together, behind one optimizer's interface (param_groups,
    step, zero_grad, state_dict, load_state_dict), which torch's GradScaler also accepts."""

    def __init__(self, parts: dict[str, torch.optim.Optimizer]):
        self.parts = parts

    @property
    def param_groups(self) -> list[dict]:
        return [group for part in self.parts.values() for group in part.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for part in self.parts.values() for p, s in part.state.items()}

    def step(self) -> None:
        for part in self.parts.values():
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts.values():
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: dict) -> None:
        # A checkpoint from before Muon existed holds one AdamW's state dict, not one per optimizer.
        if "param_groups" in state:
            state = {"adamw": state}
        if set(state) != set(self.parts):
            raise ValueError(f"the checkpoint's optimizers are {sorted(state)}, this run's {sorted(self.parts)}")
        for name, part in self.parts.items():
            part.load_state_dict(state[name])


def build_optimizers(
    model: torch.nn.Module,
    optimizer: str,
    learning_rate: float,
    muon_learning_rate: float | None,
    weight_decay: float,
    fused: bool,
) -> Optimizers:
    """fused: the plan's probe (plan/fused_adamw.py), made once per run on its device. Each group keeps
    its peak rate as `peak_lr`: the Trainer sets lr = peak_lr x the schedule's factor."""
    groups = split_parameters(model, optimizer)
    adamw_groups = [
        {"params": [p for _, p in groups[key]], "weight_decay": decay, "peak_lr": learning_rate, "name": key}
        for key, decay in (("adamw_decay", weight_decay), ("adamw_no_decay", 0.0))
        if key in groups
    ]
    parts = {
        "adamw": torch.optim.AdamW(adamw_groups, lr=learning_rate, betas=ADAMW_BETAS, fused=True if fused else None)
    }
    if "muon" in groups:
        muon_group = {"params": [p for _, p in groups["muon"]], "peak_lr": muon_learning_rate, "name": "muon"}
        parts["muon"] = torch.optim.Muon(
            [muon_group], lr=muon_learning_rate, weight_decay=weight_decay, adjust_lr_fn=MUON_ADJUST_LR
        )
    return Optimizers(parts)
