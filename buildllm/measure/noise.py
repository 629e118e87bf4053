"""How noisy was a benchmark? Its measured intervals say, and a comparison reads them back.

The benchmark times its measured steps in equal intervals. A quiet machine runs each interval at
nearly the same rate; a competing job or thermal throttling makes them differ. The benchmark
records every interval's rate as a flat number (`interval_1_steps_per_second`, ...) so that a
later comparison can put an interval around a speed-up, and it warns on the console at once when
the run was noisy.

Why 10%: on a quiet machine the intervals' coefficient of variation is well under 3% (the
committed baseline on 2 EPYC cores: 0.3%); with other jobs on the same cores it was 31-44%
(issue 10). With the default 4 intervals a CV of c puts a 95% interval of about +/- 1.6 c around
the run's mean rate (t(3) = 3.18 over sqrt(4)), so above 10% one run alone cannot resolve a
difference smaller than about 1.3x: a speed-up read from it is not a result.
"""

from __future__ import annotations

import math
import statistics

NOISY_CV = 0.10


def interval_metrics(rates: list) -> dict:
    """Each measured interval's optimizer steps/s, numbered from 1, as flat metrics."""
    return {f"interval_{i}_steps_per_second": float(rate) for i, rate in enumerate(rates, start=1)}


def _numbered(metrics: dict, key: str) -> list:
    """The values of key.format(1), key.format(2), ... up to the first one missing, in order."""
    values = []
    while isinstance(metrics.get(key.format(len(values) + 1)), (int, float)):
        values.append(float(metrics[key.format(len(values) + 1)]))
    return values


def step_peaks(metrics: dict) -> list:
    """The matmul peak (FLOP/s) measured beside each measured step, in order; [] where the peak was
    not measured between the steps (a datasheet peak, a GPU)."""
    return _numbered(metrics, "step_{}_peak_flops")


def step_times(metrics: dict) -> list:
    """Each measured step's seconds, where the steps were timed one by one (the CPU)."""
    return _numbered(metrics, "step_{}_seconds")


def interval_rates(metrics: dict) -> list:
    """The per-interval rates a benchmark recorded, in order; [] for a benchmark older than them."""
    return _numbered(metrics, "interval_{}_steps_per_second")


def coefficient_of_variation(rates: list) -> float:
    return statistics.pstdev(rates) / statistics.fmean(rates) if len(rates) > 1 else 0.0


def is_noisy(cv) -> bool:
    return isinstance(cv, (int, float)) and cv > NOISY_CV


def noise_warning(metrics: dict) -> str | None:
    """One console line when the run's intervals varied more than NOISY_CV, else None."""
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
    best = 1  # k: the interval is [x_(k), x_(n-k+1)], 1-based; coverage 1 - 2 P(X <= k-1)
    for k in range(1, n // 2 + 1):
        if 1 - 2 * sum(tail[:k]) >= confidence:
            best = k
    coverage = 1 - 2 * sum(tail[:best])
    return xs[best - 1], xs[n - best], coverage
