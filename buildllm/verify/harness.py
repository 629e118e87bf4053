"""What every check shares: its settings from params.yaml and flags, and its record and verdict
(a flat metrics file: its figures, the machine and its load at the start, and "inside" or "miss")."""

from __future__ import annotations

import os
from pathlib import Path

from buildllm.errors import UserError
from buildllm.metrics import write_metrics
from buildllm.paths import metrics_path


def add_plan_arguments(parser) -> None:
    """The flags that choose the plan a check runs; each defaults to params.yaml's."""
    parser.add_argument("--iteration", type=int, metavar="N", help="course iteration (default: params.yaml's)")
    parser.add_argument("--preset", metavar="PRESET", help="a preset instead of the iteration (tiny, student, small)")
    parser.add_argument("--device", help="device (default: params.yaml's)")
    parser.add_argument("--precision", help="precision (default: params.yaml's)")
    parser.add_argument("--threads", type=int, metavar="N")


def plan_overrides(args, extra: dict) -> dict:
    """Dotted overrides for the plan flags given and `extra` (none given: params.yaml's plan)."""
    if args.preset:
        profile = {"preset": args.preset}
    else:
        profile = {"iteration": args.iteration, "preset": None} if args.iteration else {}
    chosen = {**profile, "device": args.device, "precision": args.precision, "train.threads": args.threads, **extra}
    return {key: value for key, value in chosen.items() if value is not None or key == "preset"}


def machine() -> dict:
    from buildllm.device.device import cpuinfo
    from buildllm.device.hardware import processor_name
    from buildllm.device.load import other_load

    # The ISA features that decide kernels here (from /proc/cpuinfo, as lscpu shows them); at most 33
    # characters: a short label.
    present = cpuinfo("flags").split()
    flags = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in present]
    return {
        "processor": processor_name(),
        "cpu_flags": " ".join(flags) or "none of avx2/avx512/amx",
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
    record = {"check": check, **figures, "judged": judged, "misses": misses, "verdict": verdict}
    path = write_metrics(Path(out) if out else metrics_path(f"verify_{check}"), record)
    print(
        f"verify {check}: {max(judged - misses, 0)} of {judged} inside the stated range"
        f"{'' if not misses else f'; {misses} MISSED'}; record in {path}",
        flush=True,
    )
    return 1 if misses else 0
