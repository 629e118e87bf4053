"""Flat JSON metrics files, their summaries that DVC shows, and their notes (docs/metrics.md).

Numbers stay numbers (DVC hides a number stored as a string and shows no delta for strings); None
is refused rather than silently dropped. No absolute path: a path in a user's home folder is
neither a metric nor the same on two machines. A long label of our own is a bug and fails loudly.
DVC shows every key of every metrics file as a column of one table: the full records (about 150
keys) made lines 3,900 characters wide, so DVC is given a small summary per stage instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from buildllm import disk
from buildllm.atomic import atomic_write_text
from buildllm.errors import UserError

SCALARS = (bool, int, float, str)
MAX_LABEL = 40
# A label cut to fit is cut shorter still: two of them side by side in `dvc metrics diff --md`, with
# the path, the metric's name and a numeric change, stay within 160 columns.
CUT_LABEL = 30
NOTE_SUFFIXES = ("_reason", "_advice")  # sentences: notes only
# Labels whose text can run long (from the machine, the user, or a measurement's own account): the
# metrics file keeps the label cut to fit, which reports read; the notes keep the full text.
SHORTENED = (
    "platform",
    "processor",
    "gpu_name",
    "checkpoint_directory",
    "tokenizer",
    "peak_flops_source",
    "peak_memory_method",
)
# stage -> {name in the summary: (key in the full record, scale)}; a key the record lacks (a benchmark
# that ran out of memory has no speed) is left out of the summary.
SUMMARY = {
    # Short names: `dvc metrics show` puts every stage's figures in one table that fits 160 columns.
    "corpus": {"chars": ("characters", 1)},
    "tokens": {"tokens": ("train_tokens", 1)},  # the tokenize stage's, one per vocabulary: tokens_4096.json
    "dry_run": {"parameters": ("parameters", 1), "estimate_mib": ("memory_estimate_total_bytes", 2**-20)},
    "benchmark": {
        "tokens_per_s": ("tokens_per_second", 1),
        "peak_mib": ("peak_memory_bytes", 2**-20),
        "mfu": ("mfu", 1),
    },
    "estimate": {"minutes": ("estimated_seconds", 1 / 60)},
    "preflight": {"failed": ("checks_failed", 1)},
    "train": {
        "tokens_per_s": ("tokens_per_second", 1),
        "val_loss": ("final_validation_loss", 1),
        "val_bpb": ("final_validation_bits_per_byte", 1),  # bits per byte: comparable across tokenizers
    },
}
SUMMARY_DIGITS = 4  # significant digits: DVC prints five, and timings do not hold more
_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")


class MetricValueError(ValueError):
    """A metric the program itself made too long or made a path: fix the writer, not the user's input."""


def is_note(key: str) -> bool:
    return key.endswith(NOTE_SUFFIXES)


def short_label(text: str) -> str:
    """Text from outside the program, made to fit: an absolute path becomes `…/name`, long text is cut."""
    if _ABSOLUTE.match(text):
        text = "…/" + re.split(r"[\\/]", text.rstrip("/\\"))[-1]
    return text if len(text) <= CUT_LABEL else text[: CUT_LABEL - 1] + "…"


def split(metrics: Mapping[str, Any]) -> tuple[dict, dict]:
    """(metrics, notes): sentences and the full text of shortened labels go to the notes."""
    values, notes = {}, {}
    for key, value in metrics.items():
        if not isinstance(value, SCALARS):
            raise TypeError(f"metric {key}={value!r} is not a flat scalar")
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"metric {key}={value!r} is not finite; JSON and DVC cannot hold it")
        if is_note(key):
            notes[key] = value
            continue
        if key in SHORTENED and isinstance(value, str) and short_label(value) != value:
            notes[key], value = value, short_label(value)
        if isinstance(value, str) and (len(value) > MAX_LABEL or _ABSOLUTE.match(value)):
            raise MetricValueError(
                f"metric {key}={value!r} is not a short label ({len(value)} characters, at most "
                f"{MAX_LABEL}, no absolute path); name it *_reason or *_advice so it "
                "goes to the notes file, or shorten it"
            )
        values[key] = value
    return values, notes


def notes_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}_notes.json")


def summary_path(path: str | Path) -> Path:
    path = Path(path)
    return path.parent / "summary" / path.name


def _significant(value: float) -> float | int:
    if isinstance(value, int) or value == 0:
        return value
    rounded = float(f"{value:.{SUMMARY_DIGITS}g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) >= 10 ** (SUMMARY_DIGITS - 1) else rounded


def summarize(stage: str, values: Mapping[str, Any]) -> dict:
    summary = {}
    for name, (key, scale) in SUMMARY.get(stage, {}).items():
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        summary[name] = _significant(value * scale)  # a scale of 1 keeps an int an int
    return summary


def files_of(path: str | Path) -> list[Path]:
    """The files write_metrics(path) may write: a command checks them with its other outputs before it
    starts (disk.probe_files), so a refused place costs no work and leaves no output half-new."""
    path = Path(path)
    return [path, notes_path(path), *([summary_path(path)] if path.stem in SUMMARY else [])]


def write_metrics(path: str | Path, metrics: Mapping[str, Any]) -> Path:
    """Write the metrics file, its summary for a pipeline stage, and, when there are any, its notes
    (an old notes file is removed, so notes never outlive the run they describe)."""
    path = Path(path)
    values, notes = split(metrics)
    companion = notes_path(path)
    disk.probe_files(files_of(path))  # a refused place stops the write before any file changes
    if notes:
        atomic_write_text(companion, json.dumps(notes, indent=2) + "\n")
    elif companion.exists():
        companion.unlink()
    atomic_write_text(path, json.dumps(values, indent=2) + "\n")
    stage = re.sub(r"_\d+$", "", path.stem)  # tokens_4096: one vocabulary's record
    if stage in SUMMARY:  # atomic_write_text makes the summary folder
        atomic_write_text(summary_path(path), json.dumps(summarize(stage, values), indent=2) + "\n")
    return path


def json_line(**fields) -> None:
    """One JSON line on stdout, flushed: a long job's start-up line (the house rule) or one try's record."""
    print(json.dumps(fields), flush=True)


def read_metrics(path: str | Path, with_notes: bool = False, advice: str = "rerun the stage that writes it") -> dict:
    path = Path(path)
    if not path.exists():
        raise UserError(f"metrics file {path} does not exist; run the stage that writes it first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"metrics file {path} is not valid JSON ({exc}); {advice}") from None
    if not isinstance(data, dict):
        raise UserError(f"metrics file {path} must hold a JSON object; {advice}")
    if with_notes and notes_path(path).exists():
        # Notes are for people; a damaged one does not stop a stage that needs the numbers.
        with contextlib.suppress(json.JSONDecodeError):
            data = {**data, **json.loads(notes_path(path).read_text())}
    return data
