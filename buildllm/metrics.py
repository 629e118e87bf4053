"""Flat JSON metrics files that `dvc metrics diff` compares across experiments.

Flat: one level of keys. Numbers stay numbers (DVC hides a number stored as a string and shows no
delta for strings); None is refused rather than silently dropped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from buildllm.atomic import atomic_write_text
from buildllm.errors import UserError

SCALARS = (bool, int, float, str)


def check_flat(metrics: Mapping[str, Any]) -> dict:
    flat = {}
    for key, value in metrics.items():
        if not isinstance(value, SCALARS):
            raise TypeError(f"metric {key}={value!r} is not a flat scalar")
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"metric {key}={value!r} is not finite; JSON and DVC cannot hold it")
        flat[key] = value
    return flat


def write_metrics(path: str | Path, metrics: Mapping[str, Any]) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(check_flat(metrics), indent=2) + "\n")
    return path


def read_metrics(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"metrics file {path} does not exist; run the stage that writes it first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"metrics file {path} is not valid JSON ({exc}); rerun the stage that writes it") from None
    if not isinstance(data, dict):
        raise UserError(f"metrics file {path} must hold a JSON object; rerun the stage that writes it")
    return data
