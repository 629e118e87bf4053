"""Is A faster than B? The house's one answer: noise, paired ratios and their intervals.

**Noise.** On a quiet machine the benchmark's intervals' coefficient of variation is well under 3%
(the committed baseline on 2 EPYC cores: 0.3%); with other jobs on the same cores it was 31-44%
(issue 10). Above NOISY_CV a speed-up read from one run is not a result (why 10%, from t(3) = 3.18
over sqrt(4 intervals): docs/measuring.md, "Noise").

**A speed-up with its 95% interval** comes by one of two routes, and a report says which:
- *intervals*: one benchmark per side, a Welch-t interval on the log interval rates. It sees only
  the noise *within* each run, not a machine that was slower for one whole run than for the other:
  that is why a run over the noise threshold makes it inconclusive.
- *paired*: the candidates take turns (A B A B ..., `interleave` in one process; `buildllm compare
  --paired` in fresh processes), so drift slows both turns of a round alike and each round gives
  one ratio (above 1: the candidate is faster). The speed-up is their median; its interval, from
  the sign test's order statistics, assumes nothing of the noise's shape; 6 pairs are the fewest
  for 95%. "Conclusively faster" (buildllm/plan/tuned.py) means the whole interval is above 1 at
  95% coverage at least.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

NOISY_CV = 0.10

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; between entries the smaller
# df is used, which widens the interval (conservative). Above 30: 2.042 still, close to 1.96.
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def interval_metrics(rates: list) -> dict:
    return {f"interval_{i}_steps_per_second": float(rate) for i, rate in enumerate(rates, start=1)}


def numbered(metrics: dict, key: str) -> list:
    """The values of key.format(1), key.format(2), ... up to the first one missing, in order."""
    values = []
    while isinstance(metrics.get(key.format(len(values) + 1)), (int, float)):
        values.append(float(metrics[key.format(len(values) + 1)]))
    return values


def interval_rates(metrics: dict) -> list:
    return numbered(metrics, "interval_{}_steps_per_second")


def coefficient_of_variation(rates: list) -> float:
    return statistics.pstdev(rates) / statistics.fmean(rates) if len(rates) > 1 else 0.0


def is_noisy(cv) -> bool:
    return isinstance(cv, (int, float)) and cv > NOISY_CV


def noise_warning(metrics: dict) -> str | None:
    cv = metrics.get("throughput_cv")
    if not is_noisy(cv):
        return None
    rates = interval_rates(metrics)
    spread = f" (intervals {min(rates):.2f}-{max(rates):.2f} steps/s)" if rates else ""
    return (
        f"warning: noisy run: throughput varied {cv:.0%} between measured intervals{spread}, over the "
        f"{NOISY_CV:.0%} threshold; another job or throttling was slowing this machine. Rerun it on an idle "
        "machine, or compare on this one with `buildllm compare A B --paired`."
    )


def sign_interval(values: list, confidence: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the order-statistic interval for the median, the narrowest whose
    coverage reaches `confidence`; with too few values, min to max and the coverage it has."""
    xs, n = sorted(values), len(values)
    tail = [math.comb(n, i) / 2**n for i in range(n + 1)]
    # k: the interval is [x_(k), x_(n-k+1)], 1-based; coverage 1 - 2 P(X <= k-1)
    best = max((k for k in range(1, n // 2 + 1) if 1 - 2 * sum(tail[:k]) >= confidence), default=1)
    coverage = 1 - 2 * sum(tail[:best])
    return xs[best - 1], xs[n - best], coverage


def t975(df: float) -> float:
    return T975[max(k for k in T975 if k <= max(df, 1))]


@dataclass(frozen=True)
class Speedup:
    estimate: float
    low: float | None  # None: no interval could be formed
    high: float | None
    method: str  # how the interval was formed, in a few words
    coverage: float = 0.95  # the interval's confidence (paired mode with few pairs: less)
    pairs: int = 0

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def includes_one(self) -> bool:
        return not self.has_interval or self.low <= 1.0 <= self.high

    @property
    def level(self) -> str:  # 95%, or 96.9% for 6 pairs
        return f"{self.coverage:.1%}".replace(".0%", "%")

    def text(self) -> str:
        if not self.has_interval:
            return f"{self.estimate:.2f}× (no interval)"
        return f"{self.estimate:.2f}× ({self.level} interval {self.low:.2f}–{self.high:.2f}×, {self.method})"


def _log_mean_spread(metrics: dict) -> tuple[float, int] | None:
    """Variance of the mean log rate, and its degrees of freedom, from a benchmark's intervals."""
    rates = interval_rates(metrics)
    if len(rates) >= 2 and all(r > 0 for r in rates):
        logs = [math.log(r) for r in rates]
        return statistics.variance(logs) / len(logs), len(logs) - 1
    # An older benchmark: only the population CV and the interval count (the CV of the rates is the
    # standard deviation of their logs, to first order).
    n, cv = metrics.get("intervals"), metrics.get("throughput_cv")
    if isinstance(n, (int, float)) and n >= 2 and isinstance(cv, (int, float)):
        sample_sd = cv * math.sqrt(n / (n - 1))
        return sample_sd**2 / n, int(n) - 1
    return None


def from_intervals(reference: dict, other: dict) -> Speedup | None:
    """other's tokens/s over reference's, with a Welch-t interval on the log of the interval rates."""
    a, b = reference.get("tokens_per_second"), other.get("tokens_per_second")
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0):
        return None
    ratio = b / a
    sa, sb = _log_mean_spread(reference), _log_mean_spread(other)
    if sa is None or sb is None:
        return Speedup(ratio, None, None, "a run recorded fewer than two intervals")
    (va, dfa), (vb, dfb) = sa, sb
    total = va + vb
    if total == 0:
        return Speedup(ratio, ratio, ratio, f"intervals {dfa + 1}+{dfb + 1}, no spread")
    df = total**2 / (va**2 / dfa + vb**2 / dfb)
    half = t975(df) * math.sqrt(total)
    return Speedup(
        ratio, ratio * math.exp(-half), ratio * math.exp(half), f"Welch t over {dfa + 1}+{dfb + 1} intervals"
    )


def from_pairs(ratios: list) -> Speedup:
    low, high, coverage = sign_interval(ratios)
    method = f"paired, {len(ratios)} rounds, sign test"
    return Speedup(statistics.median(ratios), low, high, method, coverage=coverage, pairs=len(ratios))


def compare(seconds: dict[str, list[float]], reference: str) -> dict:
    """Each candidate against the reference, from per-round seconds: {name: figure} (figure: ratio,
    low, high, coverage, pairs, both medians, every ratio)."""
    base = seconds[reference]
    out = {}
    for name, times in seconds.items():
        if name == reference or not times:
            continue
        ratios = [a / b for a, b in zip(base, times)]
        s = from_pairs(ratios)
        out[name] = {
            "ratio": s.estimate,
            "low": s.low,
            "high": s.high,
            "coverage": round(s.coverage, 4),
            "pairs": s.pairs,
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
    min_rounds: int,
    clock: Callable[[], float],
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
    return seconds


@dataclass
class Paired:
    """Benchmarks rerun in rounds (buildllm/measure/workfolder.py remeasure): each round's tokens/s
    ratio to the first experiment is one pair."""

    names: list  # the experiments, first = reference
    rounds: list = field(default_factory=list)  # one {name: benchmark metrics} per round
    orders: list = field(default_factory=list)  # the order each round ran in

    def tokens_per_second(self, name: str) -> list:
        return [r[name]["tokens_per_second"] for r in self.rounds]

    def ratios(self, name: str) -> list:
        return [a / b for a, b in zip(self.tokens_per_second(name), self.tokens_per_second(self.names[0]))]

    def speedups(self) -> dict:
        return {name: from_pairs(self.ratios(name)) for name in self.names[1:]}

    def median_cv(self, name: str) -> float:
        return statistics.median(r[name].get("throughput_cv", 0.0) for r in self.rounds)
