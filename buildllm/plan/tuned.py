"""This machine's tune figures (metrics/tune.json, written by `buildllm tune`), and when a measured
ratio counts as faster. Keyed by machine id, then profile, then device: a record measured on another
machine, profile, model shape or batch applies to nothing here; without one every measured rule
(precision.py, threads.py, compile.py, loss_chunk.py) keeps its stated default and says so. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.paths import METRICS

PATH = METRICS / "tune.json"
FORMAT = 1
NOT_MEASURED = "not measured on this machine: run `buildllm tune`"
NOT_READ = "tune's record not read: the stated default"
# A measured count (threads, the loss chunk) or kernel replaces its stated default only where its
# speed-up's interval clears this gain at its LOW end. "Conclusively faster" alone (low end above 1)
# flipped the loss chunk from run to run: tune run 5 times in fresh processes on one quiet 2-core AMD
# EPYC (Zen 1, 2026-12-06) took 512, 512, 1024, 2048 and 512 rows, each on about x1.02 with its low
# end at x1.00-x1.01. A choice now flips only where a low end crosses the bar between runs: a gain
# near parity keeps the default every time, and one large enough to matter outruns the interval.
# The loss chunk's gain is judged on the whole step (plan/loss_chunk.py): on the kernel alone, a 2-core
# Zen 3 (2026-12-07) took 512 rows in one tune (2048 rows' low end x1.01) and 2048 in the next, 30
# minutes later (low end x1.05), each about x1.01 on a step of which the loss is a quarter.
# Precision has its own, higher bar (plan/precision.py): bf16 also changes what is computed.
MIN_LOW_GAIN = 1.03


def read_all() -> dict:
    """Every record in the file, {machine id: {profile: {device: record}}}; {} when there is none
    (an unreadable file counts as none: tune rewrites it)."""
    try:
        data = json.loads(PATH.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("machines"), dict):
        return {}
    return data["machines"]


def write_record(record: dict) -> Path:
    machines = read_all()
    machines.setdefault(record["machine_id"], {}).setdefault(record["profile"], {})[record["device"]] = record
    atomic_write_text(PATH, json.dumps({"format": FORMAT, "machines": machines}, indent=2, sort_keys=True) + "\n")
    return PATH


def shape_label(model, gradient_checkpointing: bool = False) -> str:
    return (
        f"{model.architecture} {model.n_layer}x{model.n_head}x{model.n_embd}, {model.sequence_length} tokens, "
        f"vocab {model.vocab_size}" + (", checkpointing" if gradient_checkpointing else "")
    )


def lookup(machine_id: str, profile: str, device: str, batch_size: int, shape: str) -> tuple[dict | None, str]:
    entry = read_all().get(machine_id, {}).get(profile, {}).get(device)
    if entry is None:
        return None, NOT_MEASURED
    if entry.get("batch_size") != batch_size or entry.get("shape") != shape:
        return None, (
            f"not measured on this machine for this run's shape (tuned: batch {entry.get('batch_size')}, "
            f"{entry.get('shape')}): run `buildllm tune` with this run's settings"
        )
    return entry, ""


def ratio_text(figure: dict) -> str:
    """x1.38 (interval 1.30-1.45, 12 pairs)."""
    return f"x{figure['ratio']:.2f} (interval {figure['low']:.2f}-{figure['high']:.2f}, {figure['pairs']} pairs)"


def faster(figure: dict) -> bool:
    """Conclusively faster: the median ratio's interval lies above 1 and covers at least 95% (6 pairs
    or more; with fewer, even min to max covers less)."""
    return figure["low"] > 1.0 and figure.get("coverage", 0.0) >= 0.95


def clears(figure: dict, bar: float = MIN_LOW_GAIN) -> bool:
    """Conclusively faster by at least `bar` at the interval's low end: enough to leave a default."""
    return faster(figure) and figure["low"] >= bar


def slower(figure: dict) -> bool:
    return figure["high"] < 1.0 and figure.get("coverage", 0.0) >= 0.95


def reference_seconds(part: dict) -> float | None:
    """A compared part's reference side (its default), median seconds per turn: every candidate was
    timed against the same one. None where nothing was compared."""
    candidates = part.get("candidates") or {}
    return next(iter(candidates.values()))["reference_median_seconds"] if candidates else None


def step_seconds(record: dict) -> float | None:
    """One training step's seconds as tune timed it (the run's precision, the default thread count, not
    compiled): the threads part's reference side, else the compile part's plain step; None without either."""
    threads = record.get("threads") or {}
    turn = reference_seconds(threads)
    if turn and threads.get("steps_per_turn"):
        return turn / threads["steps_per_turn"]
    return (record.get("compile") or {}).get("plain_step_seconds")


def measured_count(
    record: dict | None,
    why_not: str,
    key: str,
    default_key: str,
    default: int,
    unit: str,
    judged: Callable[[dict], dict] | None = None,
    judged_on: str = "",
) -> tuple[int | None, str]:
    """(count, reason) for a count tune compares against the rule's default (record[key][default_key]):
    of those whose gain over it clears MIN_LOW_GAIN, the one with the largest ratio, else the default,
    kept; (None, why) without figures compared against this default. judged: the figure the bar is
    applied to, from the measured one (a part's gain carried to what it is part of, `judged_on`)."""
    if record is None:
        return None, why_not
    figures = record.get(key) or {}
    if "skipped" in figures or figures.get(default_key) != default or not figures.get("candidates"):
        skipped = figures.get("skipped", "no candidates measured against this default")
        return None, f"measured here: {unit} not compared ({skipped})"
    candidates = {int(n): f for n, f in figures["candidates"].items()}
    said = "; ".join(f"{n} {unit} {ratio_text(f)}" for n, f in sorted(candidates.items()))
    quicker = {n: f for n, f in candidates.items() if clears(judged(f) if judged else f)}
    if quicker:
        best = max(quicker, key=lambda n: quicker[n]["ratio"])
        return best, f"{best} {unit}: measured here against the default {default}: {said}"
    bar = f"none clears x{MIN_LOW_GAIN:.2f} at its interval's low end{judged_on}"
    return default, f"{default} {unit} (the default), kept; measured here against it: {said}; {bar}"
