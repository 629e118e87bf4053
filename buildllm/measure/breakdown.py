"""Where a training step's time goes: the course's "GPU utilisation is low" and "throughput
decreases over time" rows, measured (what each part says to do: docs/measuring.md).

The parts are timed apart on a few more steps after the benchmark's timed intervals, whose
throughput their synchronisations would slow. Clipping and the scaler's checks count as compute,
with the forward, the backward and the loss read-back.
"""

from __future__ import annotations

import time
from unittest.mock import patch

from buildllm.config import Config

PHASES = ("data", "transfer", "compute", "optimizer", "validation", "checkpoint")


class _TimedDevice:
    """The trainer's device, with its host-to-device copy timed (everything else passes through)."""

    def __init__(self, device, put):
        self._device, self.put = device, put

    def __getattr__(self, name):
        return getattr(self._device, name)


def step_breakdown(trainer, steps: int) -> dict:
    spent = {"data": 0.0, "transfer": 0.0, "optimizer": 0.0}
    device = trainer.device

    def timing(phase: str, work, clock):
        def timed(*args, **kwargs):
            begin = clock()
            result = work(*args, **kwargs)
            spent[phase] += clock() - begin
            return result

        return timed

    # Instance attributes that shadow the methods; patch.object puts back whatever was there before.
    # The backward's queued work is compute's, not the optimizer's: the device is synchronised first.
    with (
        patch.object(trainer.cursor, "next", timing("data", trainer.cursor.next, time.perf_counter)),
        patch.object(trainer, "device", _TimedDevice(device, timing("transfer", device.put, device.timed))),
        patch.object(trainer.optimizer, "step", timing("optimizer", trainer.optimizer.step, device.timed)),
    ):
        begin = device.timed()
        for _ in range(steps):
            trainer.step()
        total = device.timed() - begin
    per_step = {phase: seconds / steps for phase, seconds in spent.items()}
    per_step["compute"] = max(0.0, total / steps - sum(per_step.values()))
    return {f"step_{phase}_seconds": per_step[phase] for phase in ("data", "transfer", "compute", "optimizer")}


def overheads(config: Config, validation_seconds: float, checkpoint_seconds: float) -> dict:
    t = config.train
    return {
        "step_validation_seconds": validation_seconds / t.eval_interval if t.eval_interval else 0.0,
        "step_checkpoint_seconds": checkpoint_seconds / t.checkpoint_interval if t.checkpoint_interval else 0.0,
    }


def shares(figures: dict) -> dict:
    """Each phase's share of the whole step, from a benchmark record; {} if it has no breakdown."""
    seconds = {phase: figures.get(f"step_{phase}_seconds") for phase in PHASES}
    if any(value is None for value in seconds.values()):
        return {}
    total = sum(seconds.values())
    return {phase: value / total for phase, value in seconds.items()} if total > 0 else {}
