"""Profiles: named model shapes with their CPU and GPU runtime defaults, one YAML file each.

A file's `iteration:` says which course iteration it serves; `iteration: null` makes it a preset.
Adding a profile is adding a YAML file here: the config's allowed values follow from the files.
This package imports neither the config nor torch, so the config can list the profiles cheaply;
the plan (buildllm/plan/run_plan.py) applies a config's overrides to the profile it selects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

import yaml

from buildllm.shape import GPTConfig


@dataclass(frozen=True)
class Recipe:
    """How a model learns: the optimizer, the schedule's shape and the peak learning rates (AdamW's;
    Muon's for the hidden matrices where the optimizer is muon). buildllm/plan/recipe.py applies the
    config's overrides; docs/recipes.md says how each profile's default was chosen."""

    optimizer: str
    schedule: str
    learning_rate: float
    muon_learning_rate: float | None = None
    decay_fraction: float | None = None  # wsd: the share of the steps spent decaying


@dataclass(frozen=True)
class RuntimeDefaults:
    batch_size: int
    precision: str
    workers: int
    recipe: str  # a name among the profile's recipes


@dataclass(frozen=True)
class Profile:
    name: str
    model: GPTConfig
    cpu: RuntimeDefaults
    gpu: RuntimeDefaults
    recipes: dict  # name -> Recipe
    # Architectures that keep their own output layer in this profile (YAML `own_output_layer`);
    # the others tie it to the token embedding. See docs/pipeline.md, "Profiles".
    own_output_layer: tuple[str, ...] = ()

    def with_model(self, **overrides) -> Profile:
        """This profile with its model shape overridden; whether the output layer is tied follows
        the architecture chosen, unless tied_output is overridden too."""
        model = replace(self.model, **overrides)
        tied = overrides.get("tied_output", model.architecture not in self.own_output_layer)
        return replace(self, model=replace(model, tied_output=tied))

    def runtime(self, defaults: str) -> RuntimeDefaults:
        """`defaults`: "cpu" or "gpu", as the device says (Device.runtime_defaults)."""
        return {"cpu": self.cpu, "gpu": self.gpu}[defaults]


def _files() -> dict:
    folder = resources.files(__name__)
    return {p.name.removesuffix(".yaml"): p for p in folder.iterdir() if p.name.endswith(".yaml")}


@cache
def _data(name: str) -> dict:
    path = _files().get(name)
    if path is None:
        raise ValueError(f"no profile {name!r}; known: {', '.join(available_profiles())}")
    return yaml.safe_load(path.read_text())


def available_profiles() -> list[str]:
    return sorted(_files())


def load_profile(name: str) -> Profile:
    data = _data(name)
    return Profile(
        name=data["name"],
        model=GPTConfig(**data["model"]),
        cpu=RuntimeDefaults(**data["runtime"]["cpu"]),
        gpu=RuntimeDefaults(**data["runtime"]["gpu"]),
        recipes={name: Recipe(**values) for name, values in data["recipes"].items()},
        own_output_layer=tuple(data.get("own_output_layer", ())),
    ).with_model()


@cache
def iterations() -> dict[int, str]:
    found = {int(_data(name)["iteration"]): name for name in _files() if _data(name).get("iteration") is not None}
    return dict(sorted(found.items()))


@cache
def presets() -> tuple[str, ...]:
    """The presets, smallest first (by layers x width squared, which orders their parameter counts)."""
    serve = set(iterations().values())

    def size(name: str) -> int:
        model = _data(name)["model"]
        return model["n_layer"] * model["n_embd"] ** 2

    return tuple(sorted((name for name in _files() if name not in serve), key=size))


def selected(iteration: int, preset: str | None) -> Profile:
    return load_profile(preset or iterations()[iteration])
