"""The run's optimizer: AdamW on every parameter, or Muon on the hidden 2-D weights and AdamW on the rest.

Muon orthogonalises each weight matrix's momentum (torch.optim.Muon: Newton-Schulz iterations), which
only means something for a matrix that maps one hidden vector to another: the blocks' linear layers.
Embeddings (a lookup table: one row per token, not a map), the output head (tied to the embedding at
iteration 1), norms' gains and biases stay with AdamW, as in the modded-nanogpt speedrun and
Moonshot's Muon. `Optimizers` steps both as one: the Trainer, the grad scaler and checkpoints see one
object with every parameter group.
"""

from __future__ import annotations

import math

import torch

from buildllm.plan.optimizer_groups import split_parameters

# GPT-2's betas, for AdamW whichever recipe.
ADAMW_BETAS = (0.9, 0.95)
# torch.optim.Muon's update scaled to AdamW's RMS (0.2 x sqrt(max(rows, columns))): one learning-rate
# scale for both optimizers, and the learning rates an AdamW run found carry over.
MUON_ADJUST_LR = "match_rms_adamw"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def orthogonalise(update: torch.Tensor, coefficients, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration towards the nearest orthogonal matrix, computed in `dtype`
    (torch.optim.Muon's own iteration, whose bf16 is fixed): the same operations in the same order,
    so in bf16 it gives torch's result bit for bit."""
    a, b, c = coefficients
    x = update.to(dtype, copy=True)  # a copy: with nesterov off, `update` is the momentum buffer itself
    wide = update.size(0) > update.size(1)
    if wide:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if wide else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon with its Newton-Schulz precision chosen by the plan (plan/newton_schulz.py).
    Its state and settings are torch's, so checkpoints of either load into the other."""

    def __init__(self, params, *, orthogonalise_in: str, **settings):
        super().__init__(params, **settings)
        self.orthogonalise_in = DTYPES[orthogonalise_in]

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("this Muon takes no closure: the Trainer computes the loss before the step")
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                buffer = state["momentum_buffer"]
                buffer.lerp_(param.grad, 1 - momentum)
                update = param.grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalise(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.orthogonalise_in
                )
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-lr * rms_scale(group["adjust_lr_fn"], param.shape))


def rms_scale(adjust_lr_fn: str | None, shape: tuple[int, ...]) -> float:
    """torch.optim.Muon's learning-rate scale for a (rows, columns) matrix."""
    rows, columns = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, columns))
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1, rows / columns))
    return 1.0


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
    newton_schulz: str = "bf16",
) -> Optimizers:
    """fused: the plan's probe (plan/fused_adamw.py), made once per run on its device. Each group keeps
    its peak rate as `peak_lr`: the Trainer sets lr = peak_lr x the schedule's factor. newton_schulz: the
    precision of Muon's orthogonalisation, the plan's (RunPlan.newton_schulz)."""
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
        parts["muon"] = Muon(
            [muon_group],
            lr=muon_learning_rate,
            weight_decay=weight_decay,
            adjust_lr_fn=MUON_ADJUST_LR,
            orthogonalise_in=newton_schulz,
        )
    return Optimizers(parts)


def plan_optimizers(model: torch.nn.Module, plan) -> Optimizers:
    """The plan's optimizers for `model`: its recipe, rates, weight decay, fused AdamW and Newton-Schulz precision."""
    recipe = plan.recipe
    return build_optimizers(
        model,
        recipe.optimizer,
        plan.learning_rate,
        recipe.muon_learning_rate,
        plan.config.train.weight_decay,
        plan.fused_adamw,
        plan.newton_schulz,
    )
