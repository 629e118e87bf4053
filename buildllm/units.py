"""Durations and byte counts as a person reads them, the same in every summary and report, and byte
counts as a person writes them (4GiB, 512 MB)."""

from __future__ import annotations

import re

BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
BYTE_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
# A plain decimal: digits with an optional fraction, or a fraction alone (".5"); "." alone is not one.
SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def parse_size(text: str) -> int | None:
    """Bytes from "4GiB", "512 MiB", "1.5GB" or "8000000000"; None for anything else."""
    match = SIZE.fullmatch(str(text))
    if not match or match.group(2).lower() not in BYTE_UNITS:
        return None
    return int(float(match.group(1)) * BYTE_UNITS[match.group(2).lower()])
