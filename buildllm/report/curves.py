"""The compared runs' training curves overlaid: which device reaches a loss first, and by how much.
Loss against step and against elapsed training seconds, tokens/s against step (what `dvc plots diff
A B` draws), as one PNG the report inlines.

Validation runs every eval_interval steps, so a run may have crossed the target loss before its
time to it says. Bits per byte (buildllm/data/text_bytes.py) compare across tokenizers; nats per
token only between runs that share one.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt  # the Agg backend: card_charts selects it

from buildllm.atomic import atomic_write
from buildllm.metrics import short_label
from buildllm.report.card_charts import COLORS, png, say
from buildllm.report.card_data import log_rows
from buildllm.report.experiments import Files

TARGET_NOTE = (
    "Time to the target loss: the target is the highest of the experiments' best validation losses "
    "(in bits per byte where every run records it), rounded up to the next 0.01, so every experiment "
    "with a validation reaches it; the time is the elapsed training seconds (validation and checkpoint "
    "saves included) at the first validation at or below it, resolved to the validation interval."
)
BITS, NATS = "validation_bits_per_byte", "validation_loss"
UNITS = {BITS: "bits per byte", NATS: "nats per token"}


def read_curves(experiments: list) -> dict:
    """name -> training log rows; [] where the experiment has no log of its own (train did not run in it)."""
    return {e.name: log_rows(Files(e.rev, e.source)) if "train" in e.metrics else [] for e in experiments}


def _validations(rows: list, key: str = NATS) -> list:
    return [r for r in rows if isinstance(r.get(key), (int, float))]


def loss_key(curves: dict) -> str:
    """Bits per byte when every log with a validation records it, else nats per token."""
    validated = [rows for rows in curves.values() if _validations(rows)]
    return BITS if validated and all(_validations(rows, BITS) for rows in validated) else NATS


def target_loss(curves: dict, key: str = NATS) -> float | None:
    """The loss (in `key`'s unit) every experiment with a validation reaches (None if fewer than two have one)."""
    bests = [min(r[key] for r in v) for v in (_validations(rows, key) for rows in curves.values()) if v]
    return math.ceil(max(bests) * 100) / 100 if len(bests) >= 2 else None


def time_to(rows: list, target: float | None, key: str = NATS) -> tuple[float, int] | None:
    """(elapsed seconds, step) of the first validation at or below the target; None if never."""
    if target is None:
        return None
    for r in _validations(rows, key):
        if r[key] <= target and r.get("elapsed_seconds") is not None:
            return float(r["elapsed_seconds"]), int(r["step"])
    return None


def _series(rows: list, x: str, y: str) -> tuple:
    points = [(r[x], r[y]) for r in rows if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))]
    return tuple(zip(*points)) or ([], [])


def write_curves(curves: dict, target: float | None, path: Path, key: str = NATS) -> Path:
    """The validation loss in `key`'s unit; the train loss, per token only, is drawn only in nats per token."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), constrained_layout=True)
    unit = f"validation loss ({UNITS[key]})" if key == BITS else "loss (nats per token)"
    titles = [
        ("Loss against optimizer step", "optimizer step", unit),
        ("Loss against elapsed training time", "elapsed training time (s)", unit),
        ("Training throughput per log interval", "optimizer step", "tokens/s"),
    ]
    for ax, (title, xlabel, ylabel) in zip(axes, titles):
        ax.set_title(title, fontsize=11)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(alpha=0.25)
    for i, (name, rows) in enumerate(curves.items()):
        if not rows:  # an empty line would still earn a legend entry, and hide "not recorded"
            continue
        color = COLORS[i % len(COLORS)]  # by position, as in the bar chart
        label = f"{short_label(name)}: validation" + (" (line: train)" if key == NATS else "")
        for ax, x in zip(axes[:2], ("step", "elapsed_seconds")):
            if key == NATS:
                ax.plot(*_series(rows, x, "train_loss"), color=color, alpha=0.45, linewidth=1)
            ax.plot(*_series(rows, x, key), color=color, marker="o", markersize=4, label=label)
        axes[2].plot(*_series(rows, "step", "tokens_per_second"), color=color, label=short_label(name))
        reached = time_to(rows, target, key)
        if reached is not None:
            axes[1].axvline(reached[0], color=color, linestyle=":", linewidth=1)
    if target is not None:
        axes[1].axhline(target, color="#444", linestyle="--", linewidth=1, label=f"target {target:.2f} {UNITS[key]}")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            say(ax, "not recorded (no training log)")
    fig.suptitle("Training curves: " + " vs ".join(map(short_label, curves)), fontsize=13)
    atomic_write(path, lambda tmp: tmp.write_bytes(png(fig)))
    return path
