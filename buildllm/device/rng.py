"""Every random generator a training step may draw from (dropout, sampling): seeded once, and saved
and restored with a checkpoint so a resumed run draws the same numbers."""

from __future__ import annotations

import random

import torch


def seed_all(seed: int) -> None:
    # torch.manual_seed seeds the CPU's generator and every GPU's.
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    # A checkpoint from a machine with another number of GPUs keeps the GPUs' own seeding.
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
