"""Power and cooling, for the course's "stable power and cooling" check. Each probe answers what it
can (a desktop has no battery, a VM no temperature sensors); throttling is judged from the
benchmark's own timed intervals, which every machine has: a throughput that falls interval after interval."""

from __future__ import annotations

import contextlib

import psutil
import torch

from buildllm.device.device import Device

# A steady fall by at least this share from the first to the last interval suggests throttling;
# smaller drifts are within the interval-to-interval noise of a busy machine.
THROTTLE_DROP = 0.05


def battery() -> dict:
    state = None
    with contextlib.suppress(AttributeError, NotImplementedError, OSError):
        state = psutil.sensors_battery()
    if state is None:
        return {}
    return {
        "battery_percent": round(float(state.percent), 1),
        "power_plugged": bool(state.power_plugged) if state.power_plugged is not None else True,
    }


def power_warning() -> str:
    state = battery()
    if state and not state["power_plugged"]:
        return (
            f"on battery ({state['battery_percent']:.0f}%): a laptop on battery slows down and may sleep "
            "mid-run; plug in the charger before a long run"
        )
    return ""


def sensors(device: Device) -> dict:
    """Temperatures and clocks the machine reports (flat; absent what it does not report)."""
    found: dict = {}
    temperatures = {}
    with contextlib.suppress(OSError, NotImplementedError):
        temperatures = psutil.sensors_temperatures() if hasattr(psutil, "sensors_temperatures") else {}
    readings = [t.current for entries in temperatures.values() for t in entries if t.current]
    if readings:
        found["cpu_temperature_c"] = round(max(readings), 1)
    frequency = None
    with contextlib.suppress(OSError, NotImplementedError):
        frequency = psutil.cpu_freq()
    if frequency and frequency.current:
        found["cpu_clock_mhz"] = round(frequency.current)
        if frequency.max:
            found["cpu_clock_max_mhz"] = round(frequency.max)
    if device.kind == "cuda":
        for key, probe in (("gpu_temperature_c", torch.cuda.temperature), ("gpu_clock_mhz", torch.cuda.clock_rate)):
            with contextlib.suppress(Exception):  # both need NVML (pynvml); without it the GPU's sensors stay unread
                found[key] = probe(device.index)
    return found


def interval_trend(rates: list[float]) -> dict:
    """How the benchmark's interval throughputs moved: the relative change first -> last, and how
    many times in a row an interval was slower than the one before it."""
    if len(rates) < 2 or rates[0] <= 0:
        return {"throughput_drift": 0.0, "throughput_falls": 0}
    falls = sum(later < earlier for earlier, later in zip(rates, rates[1:]))
    return {"throughput_drift": rates[-1] / rates[0] - 1.0, "throughput_falls": falls}


def throttling_suspected(benchmark: dict) -> bool:
    """Every interval slower than the one before, and the last clearly slower than the first."""
    intervals, falls = benchmark.get("intervals", 0), benchmark.get("throughput_falls", 0)
    return intervals >= 3 and falls == intervals - 1 and benchmark.get("throughput_drift", 0.0) <= -THROTTLE_DROP


def describe(sensed: dict) -> str:
    """ "CPU 71 °C, CPU clock 2596 MHz" from sensors(); "" when nothing is reported."""
    parts = []
    for key, value in sensed.items():
        who = "GPU" if key.startswith("gpu") else "CPU"
        if key.endswith("_temperature_c"):
            parts.append(f"{who} {value:.0f} °C")
        elif key.endswith("_clock_mhz"):
            top = sensed.get("cpu_clock_max_mhz") if who == "CPU" else None
            parts.append(f"{who} clock {value:.0f}" + (f"/{top:.0f}" if top else "") + " MHz")
    return ", ".join(parts)
