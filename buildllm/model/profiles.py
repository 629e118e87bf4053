"""Profiles: named model shapes with their CPU and GPU runtime defaults, kept as data files.

`--iteration N` picks the course's profile for that iteration; `--preset NAME` picks a preset
instead. Explicit values (params.yaml `model:` / `train:` or CLI flags) override a profile's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import yaml

from buildllm.config import Config
from buildllm.model import catalog
from buildllm.model.gpt import GPTConfig


@dataclass(frozen=True)
class RuntimeDefaults:
    batch_size: int
    precision: str
    workers: int
    learning_rate: float


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: GPTConfig
    cpu: RuntimeDefaults
    gpu: RuntimeDefaults

    def runtime(self, defaults: str) -> RuntimeDefaults:
        """`defaults`: "cpu" or "gpu", as the device says (Device.runtime_defaults)."""
        return {"cpu": self.cpu, "gpu": self.gpu}[defaults]


def available_profiles() -> list[str]:
    return sorted(catalog.profile_files())


def load_profile(name: str) -> Profile:
    path = catalog.profile_files().get(name)
    if path is None:
        raise ValueError(f"no profile {name!r}; known: {', '.join(available_profiles())}")
    data = yaml.safe_load(path.read_text())
    first_line = path.read_text().splitlines()[0].lstrip("# ")
    return Profile(
        name=data["name"],
        description=first_line,
        model=GPTConfig(**data["model"]),
        cpu=RuntimeDefaults(**data["runtime"]["cpu"]),
        gpu=RuntimeDefaults(**data["runtime"]["gpu"]),
    )


def profile_for(config: Config) -> Profile:
    """The profile the config selects, with its model shape overridden by `model:` values.

    tokenize.vocab_size, when set, is the model's vocabulary too: the two must always agree."""
    profile = load_profile(config.preset or catalog.iterations()[config.iteration])
    overrides = {k: v for k, v in vars(config.model).items() if v is not None}
    if config.tokenize.vocab_size is not None:
        overrides["vocab_size"] = config.tokenize.vocab_size
    return replace(profile, model=replace(profile.model, **overrides))
