"""Batch size, data-loader workers and learning rate: what was asked for, or the profile's default for
the device (profiles/*.yaml hold a `cpu` and a `gpu` set each; Device.runtime_defaults says which),
with the reason."""

from __future__ import annotations

from buildllm.profiles import Profile, RuntimeDefaults


def pick(requested, default, profile: Profile, defaults_for: str) -> tuple:
    """(value, reason) for one knob: the request when given, else the profile's default for `defaults_for`."""
    if requested is not None:
        return requested, f"requested: {requested}"
    return default, f"{default}: profile {profile.name}'s {defaults_for} default"


def decide_defaults(train, profile: Profile, defaults_for: str) -> dict[str, tuple]:
    """{batch_size, workers, learning_rate: (value, reason)} for the config's train section;
    defaults_for: "cpu" or "gpu" (Device.runtime_defaults)."""
    defaults: RuntimeDefaults = profile.runtime(defaults_for)
    return {
        name: pick(getattr(train, name), getattr(defaults, name), profile, defaults_for)
        for name in ("batch_size", "workers", "learning_rate")
    }
