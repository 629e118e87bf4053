"""Batch size and data-loader workers: what was asked for, or the profile's default for the device
(profiles/*.yaml hold a `cpu` and a `gpu` set each; Device.runtime_defaults says which). The recipe
(optimizer, schedule, learning rates) is decided beside them, in plan/recipe.py."""

from __future__ import annotations

from buildllm.profiles import Profile


def decide_defaults(train, profile: Profile, defaults_for: str) -> dict[str, tuple]:
    picked = {}
    for name in ("batch_size", "workers"):
        requested, default = getattr(train, name), getattr(profile.runtime(defaults_for), name)
        picked[name] = (
            (requested, f"requested: {requested}")
            if requested is not None
            else (default, f"{default}: profile {profile.name}'s {defaults_for} default")
        )
    return picked
