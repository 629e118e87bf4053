"""The comparison's bar chart: one panel per figure, one bar per experiment.

A figure an experiment did not record gets no bar and says so; a withheld speed-up panel says why.
Error bars show what the figure's own record allows: throughput's slowest to fastest measured
interval, the estimate's low-high range, each speed-up's 95% interval (hatched when inconclusive).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt  # the Agg backend: card_charts selects it
import pandas as pd

from buildllm.atomic import atomic_write
from buildllm.metrics import short_label
from buildllm.report.card_charts import COLORS, NOT_RECORDED, STEP_COLORS, STEP_PARTS, png, say, seconds_unit
from buildllm.report.compare import Comparison


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(frame[name], errors="coerce") if name in frame else pd.Series([float("nan")] * len(frame))


def panels(frame: pd.DataFrame) -> list:
    """(title, values, label format, (low, high) or None) for each panel, in reading order."""
    top = frame["estimated_seconds"].max(skipna=True)
    unit, name = seconds_unit(0.0 if pd.isna(top) else top)
    slow = _col(frame, "benchmark:interval_steps_per_second_min")
    fast = _col(frame, "benchmark:interval_steps_per_second_max")
    per_step = _col(frame, "tokens_per_second") / _col(frame, "steps_per_second")
    paired = "paired_tokens_per_second" in frame
    column = "paired_tokens_per_second" if paired else "tokens_per_second"
    return [
        (
            "Tokens/s, paired re-runs: median, range" if paired else "Training throughput (tokens/s), interval range",
            frame[column],
            "{:,.0f}",
            (frame[column + "_min"], frame[column + "_max"]) if paired else (slow * per_step, fast * per_step),
        ),
        ("Optimizer steps/s", frame["steps_per_second"], "{:.2f}", (slow, fast)),
        ("Peak memory (MiB)", frame["peak_memory_bytes"] / 2**20, "{:,.0f}", None),
        ("Checkpoint save (s)", frame["checkpoint_save_seconds"], "{:.2f}", None),
        (
            f"Estimated full run ({name}), low-high range",
            frame["estimated_seconds"] / unit,
            "{:,.1f}",
            (_col(frame, "estimated_seconds_low") / unit, _col(frame, "estimated_seconds_high") / unit),
        ),
        (
            f"Speed-up vs {short_label(frame['experiment'].iloc[0])}"
            + (", paired: median, interval" if paired else ", 95% interval"),
            frame["speedup_vs_first"],
            "{:.2f}×",
            (_col(frame, "speedup_low"), _col(frame, "speedup_high")),
        ),
    ]


def _label(ax, x: float, y: float, text: str, recorded: bool) -> None:
    ax.text(x, y, text, ha="center", va="bottom", fontsize=9, color="#111" if recorded else "#555")


def _ticks(ax, labels: list) -> None:
    # Side by side, labels longer than a bar is wide run into each other: slanted, each ends under its bar.
    slanted = len(labels) > 3 or max(map(len, labels)) > 12
    ax.set_xticks(
        range(len(labels)), labels, rotation=20 if slanted else 0, ha="right" if slanted else "center", fontsize=9
    )


def step_panel(ax, frame: pd.DataFrame, labels: list) -> None:
    """One stacked bar per experiment: a step's milliseconds by part, so the limit shows (data
    waiting: add workers; transfer: pin memory; optimizer at a small batch: raise the batch size)."""
    ax.set_title("Where a step's time goes (ms)", fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    # A column the frame lacks reads as NaN; a run missing any part draws no bar.
    ms = frame.reindex(columns=[f"step_{phase}_seconds" for phase, _ in STEP_PARTS]).astype(float) * 1000
    recorded = ms.notna().all(axis=1)
    ms.loc[~recorded] = 0.0
    bottoms, totals = ms.cumsum(axis=1).shift(axis=1, fill_value=0.0), ms.sum(axis=1)
    for (phase, _), column, color in zip(STEP_PARTS, ms, STEP_COLORS):
        ax.bar(range(len(labels)), ms[column], bottom=bottoms[column], color=color, label=phase)
    for i, (ok, total) in enumerate(zip(recorded, totals)):
        _label(ax, i, total, f"{total:,.1f}" if ok else NOT_RECORDED, ok)
    ax.set_ylim(0, (totals.max() or 1.0) * 1.18)
    _ticks(ax, labels)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def write_chart(c: Comparison, path: Path) -> Path:
    frame = c.frame
    names = list(frame["experiment"])
    # A metrics folder's name is its path: as long a tick label or title squeezes the panels to nothing.
    labels = [short_label(name) for name in names]
    colors = [COLORS[i % len(COLORS)] for i in range(len(names))]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5), constrained_layout=True)
    step_panel(axes.flat[6], frame, labels)
    axes.flat[7].axis("off")  # room for the stacked bar's legend
    for ax, (title, values, fmt, spread) in zip(axes.flat, panels(frame)):
        ax.set_title(title, fontsize=11)
        ax.spines[["top", "right"]].set_visible(False)
        values = pd.to_numeric(values, errors="coerce").reset_index(drop=True)
        speedup = title.startswith("Speed-up")
        if speedup and not c.speedups_shown:
            say(ax, "withheld:\nnot an equal-budget comparison", "#9C2A00", wrap=True, fontsize=10)
            ax.set(xticks=[], yticks=[])
            continue
        heights = [0.0 if pd.isna(v) else float(v) for v in values]
        hatches = ["//" if speedup and n in c.speedups and c.inconclusive(n) else "" for n in names]
        ax.bar(range(len(names)), heights, color=colors, hatch=hatches, edgecolor="white")
        tops = list(heights)
        if spread is not None:
            low, high = (pd.Series(s).reset_index(drop=True) for s in spread)
            for i, v in enumerate(heights):
                if not (pd.isna(low[i]) or pd.isna(high[i])):
                    ax.errorbar(
                        i, v, yerr=[[max(v - low[i], 0)], [max(high[i] - v, 0)]], color="#222", capsize=5, linewidth=1.2
                    )
                    tops[i] = max(v, float(high[i]))
        top = max(tops) if any(tops) else 1.0
        for i, v in enumerate(values):
            label = NOT_RECORDED if pd.isna(v) or not math.isfinite(v) else fmt.format(v)
            if hatches[i]:
                label += "\ninconclusive"
            _label(ax, i, tops[i] + top * 0.02, label, not pd.isna(v))
        if speedup:
            ax.axhline(1.0, color="#888", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, top * 1.25)
        _ticks(ax, labels)
    fig.suptitle("Device comparison: " + " vs ".join(labels), fontsize=13)
    atomic_write(path, lambda tmp: tmp.write_bytes(png(fig, dpi=110)))
    return path
