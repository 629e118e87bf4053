"""The compared runs' training curves, overlaid: which device reaches a loss first, and by how much.

Each experiment's training log (metrics/train_log.json, read from its commit as the run card reads
it) gives loss against the optimizer step and against elapsed training seconds (validation and
checkpoint saves included, continued across a resume), and tokens/s against the step: the same
three overlays `dvc plots diff A B` draws from dvc.yaml's `plots:`, here as one PNG that the
self-contained report inlines.

The time to a stated loss: the target is the highest of the experiments' best validation losses,
rounded up to the next 0.01, so that every experiment with a validation reaches it; each one's time
is the elapsed second of its first validation at or below the target. Validation runs every
eval_interval steps, so the time is resolved to that: a run may have crossed the target earlier.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI or over SSH
import matplotlib.pyplot as plt  # noqa: E402

from buildllm.atomic import atomic_path  # noqa: E402
from buildllm.report.card_charts import COLORS, say  # noqa: E402
from buildllm.report.card_data import Files, log_rows  # noqa: E402

TARGET_NOTE = (
    "Time to the target loss: the target is the highest of the experiments' best validation losses, "
    "rounded up to the next 0.01, so every experiment with a validation reaches it; the time is the "
    "elapsed training seconds (validation and checkpoint saves included) at the first validation at or "
    "below it, resolved to the validation interval."
)


def read_curves(experiments: list) -> dict:
    """name -> training log rows; [] where the experiment has no log of its own (train did not run in it)."""
    curves = {}
    for exp in experiments:
        own = "train" in exp.metrics and "train" not in exp.carried
        curves[exp.name] = log_rows(Files(exp.rev, exp.source)) if own else []
    return curves


def _validations(rows: list) -> list:
    return [r for r in rows if isinstance(r.get("validation_loss"), (int, float))]


def target_loss(curves: dict) -> float | None:
    """The loss every experiment with a validation reaches (None if fewer than two have one)."""
    bests = [min(r["validation_loss"] for r in v) for v in map(_validations, curves.values()) if v]
    return math.ceil(max(bests) * 100) / 100 if len(bests) >= 2 else None


def time_to(rows: list, target: float | None) -> tuple[float, int] | None:
    """(elapsed seconds, step) of the first validation at or below the target; None if never."""
    if target is None:
        return None
    for r in _validations(rows):
        if r["validation_loss"] <= target and r.get("elapsed_seconds") is not None:
            return float(r["elapsed_seconds"]), int(r["step"])
    return None


def _series(rows: list, x: str, y: str) -> tuple[list, list]:
    points = [(r[x], r[y]) for r in rows if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float))]
    return ([p[0] for p in points], [p[1] for p in points]) if points else ([], [])


def write_curves(curves: dict, target: float | None, path: Path) -> Path:
    """Loss against step, loss against elapsed seconds (with the target), tokens/s against step."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6), constrained_layout=True)
    titles = [
        ("step", "Loss against optimizer step", "optimizer step", "loss (nats per token)"),
        ("elapsed_seconds", "Loss against elapsed training time", "elapsed training time (s)", "loss (nats per token)"),
        ("step", "Training throughput per log interval", "optimizer step", "tokens/s"),
    ]
    for ax, (_x, title, xlabel, ylabel) in zip(axes, titles):
        ax.set_title(title, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(alpha=0.25)
    for i, (name, rows) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        for ax, x in zip(axes[:2], ("step", "elapsed_seconds")):
            ax.plot(*_series(rows, x, "train_loss"), color=color, alpha=0.45, linewidth=1)
            ax.plot(
                *_series(rows, x, "validation_loss"),
                color=color,
                marker="o",
                markersize=4,
                label=f"{name}: validation (line: train)",
            )
        axes[2].plot(*_series(rows, "step", "tokens_per_second"), color=color, label=name)
        reached = time_to(rows, target)
        if reached is not None:
            axes[1].axvline(reached[0], color=color, linestyle=":", linewidth=1)
    if target is not None:
        axes[1].axhline(target, color="#444", linestyle="--", linewidth=1, label=f"target loss {target:.2f}")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            say(ax, "not recorded (no training log)")
    fig.suptitle("Training curves: " + " vs ".join(curves), fontsize=13)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
