"""Paired, interleaved timing: candidates take turns (A B A B ...), each warmed up first.

A job that slows the machine for a few seconds slows both turns of a round alike, so each round
gives one ratio of the reference's time to a candidate's that such drift barely moves (a ratio above
1: the candidate is faster). The figure is the median ratio, with the sign test's distribution-free
interval for a median (measure/noise.py sign_interval): 6 pairs are the fewest for 95%; with
fewer, min to max and the coverage it has. "Conclusively faster" (buildllm/plan/tuned.py) means the
whole interval is above 1 at 95% coverage at least.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from buildllm.measure.noise import sign_interval


def compare(seconds: dict[str, list[float]], reference: str) -> dict:
    """Each candidate against the reference, from per-round seconds: {name: figure} (figure: ratio,
    low, high, coverage, pairs, both medians, every ratio)."""
    base = seconds[reference]
    out = {}
    for name, times in seconds.items():
        if name == reference or not times:
            continue
        ratios = [a / b for a, b in zip(base, times)]
        low, high, coverage = sign_interval(ratios)
        out[name] = {
            "ratio": statistics.median(ratios),
            "low": low,
            "high": high,
            "coverage": round(coverage, 4),
            "pairs": len(ratios),
            "median_seconds": statistics.median(times),
            "reference_median_seconds": statistics.median(base),
            "ratios": [round(r, 4) for r in ratios],
        }
    return out


def interleave(
    turns: dict[str, Callable[[], None]],
    *,
    warmup: int,
    rounds: int,
    soft_deadline: float,
    hard_deadline: float,
    min_rounds: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Seconds of each turn, round by round, in the order given (the first is the reference).

    Every candidate runs `warmup` untimed turns first. Then up to `rounds` rounds of one turn each;
    after `min_rounds` no round starts that would end (as long as the last one took) past
    `soft_deadline` (this measurement's share of the budget), and whatever the count none past
    `hard_deadline` (the whole budget's end). `clock` must wait for the device's queued work (Device.timed)."""
    for turn in turns.values():
        for _ in range(warmup):
            if clock() > hard_deadline:
                return {name: [] for name in turns}
            turn()
    seconds: dict[str, list[float]] = {name: [] for name in turns}
    last = 0.0  # the previous round's length: a round that would end past the hard deadline is not started
    for done in range(rounds):
        now = clock()
        if now + last > hard_deadline or (done >= min_rounds and now + last > soft_deadline):
            break
        for name, turn in turns.items():
            begin = clock()
            turn()
            seconds[name].append(clock() - begin)
        last = clock() - now
        tick()
    return seconds
