"""The recipe: which optimizer, which schedule, which peak learning rates, and why each.

A profile names its recipes and, per device, the default one (profiles/*.yaml; docs/recipes.md says
how the default was measured). A config's knobs override a recipe's values one at a time, so
`--recipe classic` is the course's baseline and `--optimizer muon` tries Muon on any recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from buildllm.errors import ConfigError
from buildllm.profiles import Profile

# wsd without a decay fraction from the recipe or the config: the share the WSD papers (Hu et al.
# 2024, MiniCPM; Hägele et al. 2024) found matches cosine at a fixed budget.
DEFAULT_DECAY_FRACTION = 0.2
WHY_OPTIMIZER = {
    "adamw": "AdamW on every parameter (GPT-2's optimizer)",
    "muon": "Muon on the hidden 2-D weights (orthogonalised momentum: every direction of a matrix's "
    "update moves at one rate), fused AdamW on embeddings, head, norms and biases, which are not such matrices",
}
WHY_SCHEDULE = {
    "cosine": "linear warm-up, then cosine decay to the floor",
    "wsd": "linear warm-up, a stable phase at the peak, then linear decay to the floor over the last "
    "decay_fraction of the steps: the peak rate for longer, and the decay, where the loss drops most, still whole",
}


@dataclass(frozen=True)
class RecipeDecision:
    name: str
    optimizer: str
    schedule: str
    learning_rate: float  # AdamW's peak (with muon: of the parameters AdamW has)
    muon_learning_rate: float | None  # None unless the optimizer is muon
    decay_fraction: float | None  # None unless the schedule is wsd
    reasons: dict = field(default_factory=dict)  # decision -> why, for the plan's record


def decide_recipe(train, profile: Profile, defaults_for: str) -> RecipeDecision:
    """train: the config's TrainConfig; defaults_for: "cpu" or "gpu" (Device.runtime_defaults)."""
    default = profile.runtime(defaults_for).recipe
    name = train.recipe or default
    if name not in profile.recipes:
        raise ConfigError(
            f"profile {profile.name} has no recipe {name!r} (its recipes: {', '.join(profile.recipes)}); "
            "pick one of those, or set train.optimizer and train.schedule on its default"
        )
    recipe = profile.recipes[name]
    why_name = f"requested: {name}" if train.recipe else f"{name}: profile {profile.name}'s {defaults_for} default"
    reasons = {"recipe": why_name}

    def pick(key: str, fallback=None, fallback_why: str = ""):
        requested, from_recipe = getattr(train, key), getattr(recipe, key)
        if requested is not None:
            return requested, f"requested: {requested}"
        if from_recipe is not None:
            return from_recipe, f"{from_recipe}: recipe {name}'s"
        return fallback, fallback_why

    optimizer, why = pick("optimizer")
    reasons["optimizer"] = f"{why}: {WHY_OPTIMIZER[optimizer]}"
    schedule, why = pick("schedule")
    reasons["schedule"] = f"{why}: {WHY_SCHEDULE[schedule]}"
    learning_rate, reasons["learning_rate"] = pick("learning_rate")
    muon_rate = decay = None
    if optimizer == "muon":
        # torch's match_rms_adamw scaling makes Muon's update as large as AdamW's would be, so an AdamW
        # rate carries over where no Muon rate is given (Liu et al. 2025, "Muon is Scalable for LLM Training").
        muon_rate, reasons["muon_learning_rate"] = pick(
            "muon_learning_rate",
            learning_rate,
            f"{learning_rate}: AdamW's, which Muon's AdamW-matched scale takes over",
        )
    if schedule == "wsd":
        decay, reasons["decay_fraction"] = pick(
            "decay_fraction", DEFAULT_DECAY_FRACTION, f"{DEFAULT_DECAY_FRACTION}: wsd's default"
        )
    return RecipeDecision(name, optimizer, schedule, learning_rate, muon_rate, decay, reasons)
