"""What every check shares: its settings from params.yaml and flags, and its record and verdict.

A check's record is a flat metrics file (buildllm/metrics.py), written atomically: its figures,
what was compared with what, the machine (processor model and ISA flags, as `lscpu` gives them,
and the load when it started), and `verdict` "inside" or "miss". The exit code follows the verdict.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from buildllm.config import Config, load_config
from buildllm.errors import UserError
from buildllm.metrics import write_metrics
from buildllm.paths import metrics_path

MISS = 1  # the exit code of a check with a figure outside its range


def profile_choice(iteration: int | None, preset: str | None) -> dict:
    """Dotted overrides for the profile a check was asked for (none: params.yaml's)."""
    if preset:
        return {"preset": preset}
    return {"iteration": iteration, "preset": None} if iteration else {}


def check_config(params: str, overrides: dict) -> Config:
    """params.yaml (or --params) with the check's overrides, validated as any command's config."""
    return load_config(params, overrides)


def record_path(check: str, out: str | None) -> Path:
    return Path(out) if out else metrics_path(f"verify_{check}")


def cpu_flags() -> str:
    """The ISA features that decide kernels here (from /proc/cpuinfo, as lscpu shows them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # at most 33 characters: a short label
    return " ".join(flag for flag in wanted if flag in flags) or "none of avx2/avx512/amx"


def machine() -> dict:
    from buildllm.device.hardware import processor_name
    from buildllm.device.load import other_load

    return {
        "processor": processor_name(),
        "cpu_flags": cpu_flags(),
        "logical_cores": os.cpu_count() or 0,
        "other_load_at_start": round(other_load(), 3),  # cores others used (device/load.py), ours excluded
    }


def finish(check: str, out: str | None, figures: dict, misses: int, judged: int) -> int:
    """Write the record and print where it went; 1 on a miss (or when nothing could be judged)."""
    if judged == 0:
        raise UserError(
            f"verify {check}: nothing could be measured here (see the lines above); "
            "make the token files first (`buildllm corpus && buildllm tokenize`)"
        )
    verdict = "miss" if misses else "inside"
    path = write_metrics(
        record_path(check, out), {"check": check, **figures, "judged": judged, "misses": misses, "verdict": verdict}
    )
    print(
        f"verify {check}: {max(judged - misses, 0)} of {judged} inside the stated range"
        f"{'' if not misses else f'; {misses} MISSED'}; record in {path}",
        flush=True,
    )
    return MISS if misses else 0
