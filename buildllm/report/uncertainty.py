"""A speed-up with its 95% interval, from one benchmark per side or from paired re-measurements.

Two routes, and the report says which one each figure took:
- **intervals**: each benchmark times its measured steps in equal intervals. The speed-up is the
  ratio of the two runs' tokens/s; its interval comes from the intervals' spread on a log scale
  (Welch's t, so few intervals give a wide interval, as they should). It sees only the noise
  *within* each run, not a machine that was slower for one whole run than for the other: that is
  why a run over the noise threshold makes the result inconclusive whatever its interval says.
- **paired** (`buildllm compare --paired`): the benchmarks are rerun interleaved on this machine,
  each in a fresh process; each round gives one ratio, so drift hits both sides of a ratio. The
  speed-up is the median ratio; its interval is the distribution-free one for a median (order
  statistics chosen by the sign test's binomial tail): no assumption on how the noise is shaped.
  It needs 6 pairs to reach 95%; with fewer the widest interval (min to max) covers less, and the
  report says how much.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from buildllm.measure.noise import interval_rates, sign_interval  # noqa: F401 (report's name for it)

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


def t975(df: float) -> float:
    usable = [k for k in T975 if k <= max(df, 1)]
    return T975[max(usable)]


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
    def level(self) -> str:
        """The interval's confidence as a reader sees it: 95%, or 96.9% for 6 pairs."""
        return (
            f"{self.coverage:.0%}"
            if abs(self.coverage * 100 - round(self.coverage * 100)) < 1e-9
            else f"{self.coverage:.1%}"
        )

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
    """The median of per-round ratios with its sign-test interval."""
    low, high, coverage = sign_interval(ratios)
    return Speedup(
        statistics.median(ratios),
        low,
        high,
        f"paired, {len(ratios)} rounds, sign test",
        coverage=coverage,
        pairs=len(ratios),
    )
