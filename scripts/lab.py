"""The lab scripts' one harness, on the library's public functions: a profile's plan on this CPU, a
Trainer of it on random tokens, interleaved timing, and where a script's figures go.

The tokens are random but seeded: a step's cost does not depend on which tokens it reads, and no
corpus is needed. Scripts import this module by name (Python puts a script's own folder first on
its path); nothing here or in them writes into the package.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
import yaml

from buildllm import profiles

# The profiles the scripts take, by the name they take them: iteration<N> or a preset's name.
PROFILES = {
    **{f"iteration{n}": {"iteration": n, "preset": None} for n in profiles.iterations()},
    **{name: {"preset": name} for name in profiles.presets()},
}


def cpu_plan(profile: str, precision: str, threads: int, architecture: str | None = None, settings: dict | None = None):
    """The run plan of `profile` on the CPU, applied (threads set); `settings` overrides more knobs."""
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
    plan = make_plan(load_config(None, chosen))
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


def write_figures(path: str | Path, figures: dict, header: str) -> Path:
    """A script's figures as YAML at `path` (under the working directory, never in the package),
    written atomically."""
    from buildllm.atomic import atomic_write_text

    path = Path(path)
    if Path(__file__).resolve().parents[1] / "buildllm" in path.resolve().parents:
        raise SystemExit(f"{path}: figures measured here do not go into the package; write them elsewhere")
    atomic_write_text(path, header + yaml.safe_dump(figures, sort_keys=True))
    return path


def profile_name(profile: str) -> str:
    """The profile file a script's profile name selects (iteration1 -> gpt_first_cpu)."""
    chosen = PROFILES[profile]
    return chosen["preset"] or profiles.iterations()[chosen["iteration"]]
