"""Which profiles exist, read from the profile files themselves (no torch): each file's `iteration:`
says which course iteration it serves; a profile with `iteration: null` is a preset. Adding a profile
is adding a YAML file; the config's allowed values follow from it."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml


def profile_files() -> dict:
    folder = resources.files("buildllm.model") / "profiles"
    return {p.name.removesuffix(".yaml"): p for p in folder.iterdir() if p.name.endswith(".yaml")}


@cache
def iterations() -> dict[int, str]:
    """{iteration: profile name} for the course's iterations."""
    found = {}
    for name, path in profile_files().items():
        iteration = yaml.safe_load(path.read_text()).get("iteration")
        if iteration is not None:
            found[int(iteration)] = name
    return dict(sorted(found.items()))


@cache
def presets() -> tuple[str, ...]:
    """The presets, smallest first (by layers x width squared, which orders their parameter counts)."""
    serve = set(iterations().values())

    def size(name: str) -> int:
        model = yaml.safe_load(profile_files()[name].read_text())["model"]
        return model["n_layer"] * model["n_embd"] ** 2

    return tuple(sorted((name for name in profile_files() if name not in serve), key=size))
