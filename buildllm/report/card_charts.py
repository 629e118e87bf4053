"""The run card's charts, each a PNG in memory, and the formatting and colours every report shares.

Every axis names its unit. A figure a run did not record is drawn and written as "not recorded",
never as a zero or a guess.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI or over SSH
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from buildllm import units  # noqa: E402

NOT_RECORDED = "not recorded"


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def recorded(show):
    """`show` for a recorded value, "not recorded" for None or NaN: every report's figures read alike."""
    return lambda v: NOT_RECORDED if missing(v) else show(v)


duration, size = recorded(units.duration), recorded(units.size)


def number(fmt: str):
    return recorded(fmt.format)


def span(show, point, low, high) -> str:
    """A figure with its stated range (`show` formats each), as the estimates state theirs."""
    stated = "" if missing(low) or missing(high) else f" (range {show(low)} – {show(high)})"
    return NOT_RECORDED if missing(point) else show(point) + stated


def machine_line(get) -> str:
    """The machine a run's benchmark recorded (`get`: its metric by key): the compare report's and the run card's."""

    def value(key):
        v = get(key)
        return NOT_RECORDED if missing(v) or v == "" else v

    if value("processor") == value("torch_version") == NOT_RECORDED:
        return "not recorded (metrics/benchmark.json is absent or has no environment record)"
    gpu = f"{value('gpu_name')} ({size(get('gpu_memory_bytes'))})" if value("gpu_name") != NOT_RECORDED else "none"
    return (
        f"processor {value('processor')}; GPU {gpu}; memory {size(get('memory_total_bytes'))}; "
        f"PyTorch {value('torch_version')} (CUDA build {value('torch_cuda_version')}); "
        f"Python {value('python_version')}; {value('platform')}; BuildLLM {value('buildllm_version')}; "
        f"{number('{:.0f}')(get('threads'))} threads; logical cores {number('{:.0f}')(get('logical_cores'))}; "
        f"CPU capability {value('cpu_capability')}"
    )


# The memory model's parts (buildllm/memory/estimate.py), bottom of the stack first.
MEMORY_PARTS = [
    ("weights", "weights"),
    ("gradients", "gradients"),
    ("optimizer", "AdamW state (2 moments)"),
    ("autocast_weights", "autocast weight copies"),
    ("activations", "activations"),
    ("attention_scores", "attention scores"),
    ("logits", "logits"),
    ("allocator", "allocator reserve"),
    ("workspace", "kernel workspaces, compiled code"),
]
MEMORY_COLORS = ["#4C72B0", "#55A868", "#8172B3", "#64B5CD", "#DD8452", "#DA8BC3", "#C44E52", "#8C8C8C", "#CCB974"]
# The benchmark's step breakdown (buildllm/measure/breakdown.py), in the order a step runs.
STEP_PARTS = [
    ("data", "data loading"),
    ("transfer", "host→device copy"),
    ("compute", "forward + backward"),
    ("optimizer", "optimizer"),
    ("validation", "validation (spread)"),
    ("checkpoint", "checkpoints (spread)"),
]
STEP_COLORS = ["#C44E52", "#DD8452", "#4C72B0", "#55A868", "#8172B3", "#937860"]
# One colour per experiment in the comparison's charts (buildllm/report/chart.py, curves.py).
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def png(fig, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return buffer.getvalue()


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def seconds_unit(largest: float) -> tuple[float, str]:
    if largest < 120:
        return 1.0, "s"
    return (60.0, "min") if largest < 2 * 3600 else (3600.0, "h")


def say(ax, text: str, color: str = "#555", **style) -> None:
    """Words in the middle of an empty panel, where its bars or lines would be."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=color, **style)


def _chart(title: str, height: float):
    """One of the card's charts: all 6.4 inches wide, as they sit two to a row on the page."""
    fig, ax = plt.subplots(figsize=(6.4, height), constrained_layout=True)
    ax.set_title(title, fontsize=10.5, loc="left")
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(alpha=0.25)
    return fig, ax


def _legend(ax) -> None:
    """Below the plot: the charts sit two to a row on the page, so there is no room beside them."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def memory_chart(dry_run: dict, benchmark: dict, train: dict) -> bytes:
    """The estimate's parts stacked (with its low-high range) beside each measured peak."""
    parts = [(label, _number(dry_run.get(f"memory_estimate_{key}_bytes"))) for key, label in MEMORY_PARTS]
    total, low, high = (_number(dry_run.get(f"memory_estimate_{k}_bytes")) for k in ("total", "low", "high"))
    peaks = [
        ("measured peak\n(benchmark)", _number(benchmark.get("peak_memory_bytes"))),
        ("measured peak\n(training run)", _number(train.get("peak_memory_bytes"))),
    ]
    largest = max([v for v in [total, high] + [p for _, p in peaks] if v] or [1.0])
    scale, unit = (2**30, "GiB") if largest >= 4 * 2**30 else (2**20, "MiB")
    fig, ax = _chart("Memory: the estimate's parts beside the measured peaks", 4.3)
    top = 0.0
    if total is None:
        ax.text(0, 0, NOT_RECORDED, ha="center", va="bottom", color="#555")
    else:
        bottom = 0.0
        for (label, value), color in zip(parts, MEMORY_COLORS):
            if value:  # a part that is zero here (no autocast copy in fp32, say) takes no room
                ax.bar(0, value / scale, bottom=bottom, color=color, width=0.55, label=label)
                bottom += value / scale
        if low is not None and high is not None:
            yerr = [[total / scale - low / scale], [high / scale - total / scale]]
            ax.errorbar(
                0, total / scale, yerr=yerr, color="#222", capsize=6, linewidth=1.2, label="estimate's low–high range"
            )
        top = max(bottom, (high or 0) / scale)
        ax.text(0, top, f"{total / scale:,.1f} {unit}", ha="center", va="bottom", fontsize=9)
    for i, (_label, value) in enumerate(peaks, start=1):
        if value is None:
            ax.text(i, 0, NOT_RECORDED, ha="center", va="bottom", color="#555")
            continue
        ax.bar(i, value / scale, color="#2F2F2F", width=0.55)
        ax.text(i, value / scale, f"{value / scale:,.1f} {unit}", ha="center", va="bottom", fontsize=9)
        top = max(top, value / scale)
    ax.set_xticks(range(3), ["estimate\n(dry run)"] + [label for label, _ in peaks])
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(0, (top or 1.0) * 1.18)
    _legend(ax)
    return png(fig)


def step_chart(benchmark: dict) -> bytes:
    seconds = [_number(benchmark.get(f"step_{key}_seconds")) for key, _ in STEP_PARTS]
    fig, ax = _chart("Where a training step's time goes (benchmark)", 3.0)
    ax.set_yticks([])
    ax.set_xlabel("time per optimizer step (ms)")
    if any(s is None for s in seconds):
        say(ax, NOT_RECORDED + " (metrics/benchmark.json has no step breakdown)")
        ax.set_xticks([])
        return png(fig)
    total, left = sum(seconds) * 1000, 0.0
    for (_, label), value, color in zip(STEP_PARTS, seconds, STEP_COLORS):
        ms = value * 1000
        ax.barh(0, ms, left=left, color=color, height=0.5, label=f"{label}: {ms:,.2f} ms ({ms / total:.0%})")
        left += ms
    ax.text(total, 0.3, f"{total:,.1f} ms", ha="right", va="bottom", fontsize=9)
    ax.set_xlim(0, total * 1.02)
    ax.set_ylim(-0.4, 0.6)
    _legend(ax)
    return png(fig)


def estimate_chart(estimate: dict, measured: float | None, measured_label: str) -> bytes:
    point, low, high = (_number(estimate.get(f"estimated_seconds{end}")) for end in ("", "_low", "_high"))
    largest = max(v for v in (point, high, measured, 1.0) if v is not None)
    scale, unit = seconds_unit(largest)
    fig, ax = _chart("Time: the estimate (before training) against the measured run", 2.9)
    ax.set_yticks([0, 1], ["measured", "estimate"])
    ax.set_xlabel(f"run time ({unit})")
    if point is None:
        ax.text(0, 1, NOT_RECORDED, va="center", color="#555")
    else:
        if low is not None and high is not None:
            ax.barh(1, (high - low) / scale, left=low / scale, height=0.4, color="#B7C9E2", label="estimate's range")
        ax.plot([point / scale], [1], "o", color="#4C72B0", label="estimate")
        ax.text(point / scale, 1.25, f"{point / scale:,.1f} {unit}", ha="center", fontsize=9)
    if measured is None:
        ax.text(0, 0, NOT_RECORDED, va="center", color="#555")
    else:
        ax.plot([measured / scale], [0], "D", color="#C44E52", label=measured_label)
        ax.text(measured / scale, 0.25, f"{measured / scale:,.1f} {unit}", ha="center", fontsize=9)
    ax.set_xlim(0, largest / scale * 1.1)
    ax.set_ylim(-0.5, 1.6)
    _legend(ax)
    return png(fig)


def loss_chart(rows: list, unigram: float | None, vocab_size: int | None) -> bytes:
    fig, ax = _chart("Loss: does the model beat one that ignores context?", 4.3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    train = [(r["step"], r["train_loss"]) for r in rows if _number(r.get("train_loss")) is not None]
    validation = [(r["step"], r["validation_loss"]) for r in rows if _number(r.get("validation_loss")) is not None]
    if not train and not validation:
        say(ax, NOT_RECORDED + " (no metrics/train_log.json)")
    if train:
        ax.plot(*zip(*train), color="#4C72B0", label="train loss (mean over each log interval)")
    if validation:
        ax.plot(*zip(*validation), color="#DD8452", marker="o", label="validation loss")
    if vocab_size:
        uniform = math.log(vocab_size)
        ax.axhline(uniform, color="#888", linestyle=":", label=f"uniform guess: ln {vocab_size:,} = {uniform:.2f}")
    if unigram is not None:
        label = f"unigram level (token frequencies, no context): {unigram:.2f}"
        ax.axhline(unigram, color="#55A868", linestyle="--", label=label)
    _legend(ax)
    return png(fig)


def composed_page(title: str, lines: list, charts: list) -> bytes:
    """The card drawn by matplotlib alone (no Chromium here): its title and key lines over its charts."""
    images = [plt.imread(io.BytesIO(chart), format="png") for chart in charts]
    rows = math.ceil(len(images) / 2)
    head = 0.8 + 0.26 * len(lines)
    fig = plt.figure(figsize=(13, head + 4.6 * rows))
    fig.subplots_adjust(left=0.02, right=0.98, top=0.98, bottom=0.01, hspace=0.02, wspace=0.02)
    grid = fig.add_gridspec(1 + rows, 2, height_ratios=[head] + [4.6] * rows)
    text = fig.add_subplot(grid[0, :])
    text.axis("off")
    text.text(0, 1, title, fontsize=16, weight="bold", va="top", transform=text.transAxes)
    for i, line in enumerate(lines):
        text.text(0, 1 - (i + 1.6) / (len(lines) + 1.6), line, fontsize=9.5, va="top", transform=text.transAxes)
    for i, img in enumerate(images):
        ax = fig.add_subplot(grid[1 + i // 2, i % 2])
        ax.imshow(img)
        ax.axis("off")
    return png(fig)
