"""The lab tools' one harness, on the library's public functions: a profile's plan on this CPU, a
Trainer of it on random tokens, and a call's seconds.

The tokens are random but seeded: a step's cost does not depend on which tokens it reads, and no
corpus is needed. The tools import it as `lab.harness` (they run as `python -m lab.NAME` from the
project's root); nothing here or in them writes into the package.
"""

from __future__ import annotations

import tempfile
import time

import torch

from buildllm import profiles

# The profiles the scripts take, by the name they take them: iteration<N> or a preset's name.
PROFILES = {
    **{f"iteration{n}": {"iteration": n, "preset": None} for n in profiles.iterations()},
    **{name: {"preset": name} for name in profiles.presets()},
}


def cpu_plan(
    profile: str,
    precision: str,
    threads: int,
    architecture: str | None = None,
    settings: dict | None = None,
    apply: bool = True,
    tuned: bool = False,
):
    """The run plan of `profile` on the CPU, applied (threads, allocator: apply_plan) unless `apply` is
    False; `settings` overrides more knobs. Without `tuned` the plan reads no tune record (the loss chunk,
    attention and compile are the stated defaults), so a tool measures the same plan before and after
    `buildllm tune` ran in this folder; with it, what this machine's record decides, as `train` would."""
    from buildllm.config import load_config
    from buildllm.plan.run_plan import apply_plan, make_plan

    chosen = {
        **PROFILES[profile],
        "device": "cpu",
        "precision": precision,
        "train.threads": threads,
        "train.training_examples": None,
        **(settings or {}),
    }
    if architecture:
        chosen["model.architecture"] = architecture
    plan = make_plan(load_config(None, chosen), read_tune=tuned)
    if apply:
        apply_plan(plan)
    return plan


def random_tokens(vocab_size: int, count: int) -> torch.Tensor:
    """`count` seeded random token ids, stored as the tokenize stage stores them (uint16)."""
    return torch.randint(vocab_size, (count,), generator=torch.Generator().manual_seed(0)).to(torch.uint16)


# The trainers' checkpoint directory: they never save, so they share one, removed when the script exits.
_SCRATCH = tempfile.TemporaryDirectory(prefix="buildllm-lab-")


def random_token_trainer(plan, steps: int):
    """A Trainer of `plan` on enough random tokens for `steps` steps without wrapping around."""
    from buildllm.data.windows import Windows
    from buildllm.train.trainer import Trainer

    length = plan.model.sequence_length
    tokens = random_tokens(plan.model.vocab_size, (steps + 1) * plan.batch_size * length + 1)
    return Trainer(plan, Windows(tokens, length), None, directory=_SCRATCH.name)


def seconds_per_call(work, repeats: int) -> float:
    """Seconds per call of `work`, after one untimed call."""
    work()
    begin = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - begin) / repeats
