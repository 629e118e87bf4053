"""A profile's plan on this CPU and a Trainer of it on random tokens: what the measurement scripts
(profile_step, mfu_ceiling, side_by_side, compile_gain, bf16_gain) time. The tokens are random but
seeded: a step's cost does not depend on which tokens it reads, and no corpus is needed.
"""

from __future__ import annotations

import tempfile

import torch

# The profiles the scripts take, by the name they take them.
PROFILES = {"iteration1": {"iteration": 1}, "student": {"preset": "student"}, "small": {"preset": "small"},
            "tiny": {"preset": "tiny"}}


def cpu_plan(profile: str, precision: str, threads: int, architecture: str | None = None,
             settings: dict | None = None):
    """The run plan of `profile` on the CPU, applied (threads set); `settings` overrides more knobs."""
    from buildllm.config import load_config
    from buildllm.plan import apply_plan, make_plan

    chosen = {**PROFILES[profile], "device": "cpu", "precision": precision, "train.threads": threads,
              "train.training_examples": None, **(settings or {})}
    if architecture:
        chosen["model.architecture"] = architecture
    plan = make_plan(load_config(None, chosen))
    apply_plan(plan)
    return plan


def random_tokens(vocab_size: int, count: int) -> torch.Tensor:
    """`count` seeded random token ids, stored as the tokenize stage stores them (uint16)."""
    return torch.randint(vocab_size, (count,), generator=torch.Generator().manual_seed(0)).to(torch.uint16)


def random_token_trainer(plan, steps: int):
    """A Trainer of `plan` on enough random tokens for `steps` steps without wrapping around."""
    from buildllm.data.windows import Windows
    from buildllm.train.trainer import Trainer

    length = plan.model.sequence_length
    tokens = random_tokens(plan.model.vocab_size, (steps + 1) * plan.batch_size * length + 1)
    return Trainer(plan, Windows(tokens, length), None,
                   directory=tempfile.mkdtemp(prefix=f"{plan.profile.name}-random-tokens-"))
