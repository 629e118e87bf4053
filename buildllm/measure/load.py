"""Is another job sharing the cores a measurement runs on? Measured at its start and its end.

Two benchmarks sharing the cores can each be steady and both slow: their intervals agree, so the
interval CV (stats.py) does not see it. So every measurement also records the load from other
processes just before it starts and just after it ends.

How: the CPU time spent on this process's CPUs (its affinity set) over a short window, from the
kernel's per-CPU counters, minus the time this process and its children spent, divided by the
window: the cores' worth of CPU that everything else used. Hypervisor steal counts as others' (a
neighbouring virtual machine took it). Not psutil's per-process cpu_percent: inside a container it
sees only the container's own processes, not a job in the next container on the same cores. Not
/proc/loadavg: a one-minute damped average of runnable threads, our own included, that lags by a
minute at the start and counts our own threads at the end, with no way to tell them apart.

When busy: the measurement uses `used` cores (its torch threads on the CPU; one core that feeds an
accelerator) of the `available` ones. Others' load first fills the cores we leave idle; what is
left over takes cores from the measurement. Above BUSY_SHARE of the cores it uses, at the start or
the end, the figures were taken on a busy machine: on 2 cores with 2 threads, another job using
more than half a core.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

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
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended meanwhile: counted in children_* once reaped
            pass
    return total


def other_load(window: float = WINDOW_SECONDS) -> float:
    """Cores' worth of CPU that other processes used on this process's CPUs over the next `window` s."""
    cpus = our_cpus()
    busy, own, start = _busy_seconds(cpus), _own_seconds(), time.monotonic()
    time.sleep(window)
    busy, own = _busy_seconds(cpus) - busy, _own_seconds() - own
    return max(0.0, (busy - own) / (time.monotonic() - start))


def contended_share(others: float, used: int, available: int) -> float:
    """The share of the measurement's `used` cores that others' load takes, once it has filled the
    cores the measurement leaves idle."""
    used = max(1, used)
    return min(1.0, max(0.0, others + used - available) / used)


@dataclass
class LoadWatch:
    """Others' load at a measurement's start (made here) and end (`end()`), and whether it was busy."""

    used: int
    available: int = 0
    start: float = 0.0
    end_load: float | None = None

    def __post_init__(self):
        self.available = self.available or len(our_cpus())
        self.start = other_load()

    def end(self) -> dict:
        self.end_load = other_load()
        share = max(contended_share(load, self.used, self.available) for load in (self.start, self.end_load))
        busy = share > BUSY_SHARE
        figures = {
            "other_load_start": round(self.start, 3),
            "other_load_end": round(self.end_load, 3),
            "cores_used": self.used,
            "cores_available": self.available,
            "contended_share": round(share, 3),
            "busy_machine": busy,
        }
        if busy:
            figures["busy_machine_reason"] = busy_line(figures)
        return figures


def busy_line(m: dict) -> str:
    return (
        f"busy machine: other processes used {m['other_load_start']:.2f} cores at the start and "
        f"{m['other_load_end']:.2f} at the end, of the {m['cores_available']} this run may use "
        f"({m['cores_used']} for it): up to {m['contended_share']:.0%} of its cores were taken, over "
        f"{BUSY_SHARE:.0%}. These figures are slower than this machine can do; rerun when it is idle."
    )


def busy_warning(metrics: dict) -> str | None:
    """One console line when a measurement was taken on a busy machine, else None."""
    if not metrics.get("busy_machine"):
        return None
    return "warning: " + busy_line(metrics)
