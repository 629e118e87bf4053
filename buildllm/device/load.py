"""Is another job sharing the cores a measurement runs on?

Two benchmarks sharing the cores can each be steady and both slow: their intervals agree, so the
interval CV (stats.py) does not see it. So every measurement records others' load just before it
starts, over its measured window and just after it ends (LoadWatch), and a training run samples it
at each log row (LoadSampler): two reads of the kernel's counters, no waiting, so a run that misses
its estimate can say whether it was crowded.

How: the CPU time spent on this process's CPUs (its affinity set), from the kernel's per-CPU
counters, minus the time this process and its children spent, divided by the window: the cores'
worth of CPU everything else used (hypervisor steal included: a neighbouring virtual machine took
it). Not psutil's per-process cpu_percent: inside a container it sees only the container's own
processes. Not /proc/loadavg: a one-minute damped average that lags at the start and counts our own
threads at the end, with no way to tell them apart.

Busy: the measurement uses `used` cores (its torch threads on the CPU; one core that feeds an
accelerator) of the `available` ones, and others' load first fills the cores it leaves idle. Above
BUSY_SHARE of the cores it uses the figures were taken on a busy machine: on 2 cores with 2
threads, another job using more than half a core.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

BUSY_SHARE = 0.25
WINDOW_SECONDS = 0.5
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # guest time is inside user/nice


def our_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(psutil.cpu_count()))


def _busy_seconds(cpus: list[int]) -> float:
    per_cpu = psutil.cpu_times(percpu=True)
    return sum(getattr(per_cpu[i], field, 0.0) for i in cpus if i < len(per_cpu) for field in _BUSY_FIELDS)


def _own_seconds() -> float:
    """This process's CPU time, its threads and its live and finished children included."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended meanwhile: counted in children_* once reaped
            total += sum(child.cpu_times()[:2])
    return total


def _counters(cpus: list[int]) -> tuple[float, float, float]:
    return _busy_seconds(cpus), _own_seconds(), time.monotonic()


def _others(before: tuple, after: tuple) -> float:
    """Cores' worth of CPU others used between two _counters readings."""
    seconds = after[2] - before[2]
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / seconds) if seconds > 0 else 0.0


def other_load(window: float = WINDOW_SECONDS) -> float:
    """Cores' worth of CPU that other processes used on this process's CPUs over the next `window` s."""
    cpus = our_cpus()
    before = _counters(cpus)
    time.sleep(window)
    return _others(before, _counters(cpus))


def contended_share(others: float, used: int, available: int) -> float:
    """The share of the measurement's `used` cores that others' load takes, once it has filled the
    cores the measurement leaves idle."""
    used = max(1, used)
    return min(1.0, max(0.0, others + used - available) / used)


class LoadWatch:
    """Others' load at a measurement's start (made here) and end (`end()`), and whether it was busy."""

    def __init__(self, used: int):
        self.used, self.available = used, len(our_cpus())
        self.start = other_load()
        self.window: tuple | None = None

    def mark(self) -> None:
        """The measured window starts now (the benchmark's first measured step)."""
        self.window = _counters(our_cpus())

    def end(self) -> dict:
        window = _others(self.window, _counters(our_cpus())) if self.window else None
        end = other_load()
        loads = (self.start, end) + ((window,) if window is not None else ())
        share = max(contended_share(load, self.used, self.available) for load in loads)
        figures = {
            "other_load_start": round(self.start, 3),
            **({"other_load_window": round(window, 3)} if window is not None else {}),
            "other_load_end": round(end, 3),
            "cores_used": self.used,
            "cores_available": self.available,
            "contended_share": round(share, 3),
            "busy_machine": share > BUSY_SHARE,
        }
        if figures["busy_machine"]:
            figures["busy_machine_reason"] = load_line(figures)
        return figures


def load_line(m: dict) -> str:
    """A LoadWatch's figures in one line, busy or not; a busy one says how busy, and what to do."""
    window = f", {m['other_load_window']:.2f} over the measured steps" if "other_load_window" in m else ""
    verdict = "busy machine" if m["busy_machine"] else "machine not busy"
    line = (
        f"{verdict}: other processes used {m['other_load_start']:.2f} cores at the start{window} and "
        f"{m['other_load_end']:.2f} at the end"
    )
    if not m["busy_machine"]:
        return line
    return (
        f"{line}, of the {m['cores_available']} this run may use ({m['cores_used']} for it): up to "
        f"{m['contended_share']:.0%} of its cores were taken, over {BUSY_SHARE:.0%}. These figures are slower "
        "than this machine can do; rerun when it is idle."
    )


def busy_warning(metrics: dict) -> str | None:
    return "warning: " + load_line(metrics) if metrics.get("busy_machine") else None


class LoadSampler:
    """Others' load through a training run: sample() at each log row (no waiting), figures() at its end.

    Busy when the load over the whole run, once it has filled the cores the run leaves idle, took more
    than BUSY_SHARE of the run's cores; busy_time_share says for how much of the run a log interval did."""

    def __init__(self, used: int):
        self.cpus = our_cpus()
        self.used, self.available = used, len(self.cpus)
        self.first = self.last = _counters(self.cpus)
        self.samples: list[tuple[float, float]] = []  # (seconds, others' cores) per interval

    def sample(self) -> float:
        now = _counters(self.cpus)
        load = _others(self.last, now)
        self.samples.append((now[2] - self.last[2], load))
        self.last = now
        return load

    def figures(self) -> dict:
        self.sample()
        mean = _others(self.first, self.last)
        total = sum(seconds for seconds, _ in self.samples) or 1.0
        crowded = sum(s for s, load in self.samples if contended_share(load, self.used, self.available) > BUSY_SHARE)
        share = contended_share(mean, self.used, self.available)
        figures = {
            "other_load_mean": round(mean, 3),
            "other_load_max": round(max(load for _, load in self.samples), 3),
            "load_samples": len(self.samples),
            "busy_time_share": round(crowded / total, 3),
            "cores_used": self.used,
            "cores_available": self.available,
            "contended_share": round(share, 3),
            "busy_machine": share > BUSY_SHARE,
        }
        figures["busy_machine_reason"] = run_load_line(figures)
        return figures


def run_load_line(m: dict) -> str:
    verdict = "busy machine" if m["busy_machine"] else "machine not busy"
    return (
        f"{verdict}: other processes used {m['other_load_mean']:.2f} cores on average during training "
        f"(up to {m['other_load_max']:.2f} in a log interval) of the {m['cores_available']} this run may use "
        f"({m['cores_used']} for it): {m['contended_share']:.0%} of its cores taken, busy in "
        f"{m['busy_time_share']:.0%} of the run (threshold {BUSY_SHARE:.0%})"
    )
