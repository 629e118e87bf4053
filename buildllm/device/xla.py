"""The XLA step boundary. torch_xla records operations into a graph and runs it only at a boundary;
without one per optimizer step the graph grows step after step (recompiling, then running out of
memory). The train step marks one after the optimizer update, so every step is the same graph.
"""

from __future__ import annotations

import importlib

from buildllm.device.device import Device


def step_boundary(device: Device) -> bool:
    """End the step's graph on an XLA device (torch_xla.sync() where it exists, the older
    xm.mark_step() before it); nothing elsewhere. Returns whether a boundary was marked."""
    if device.kind != "xla":
        return False
    torch_xla = importlib.import_module("torch_xla")
    if callable(getattr(torch_xla, "sync", None)):
        torch_xla.sync()
    else:
        importlib.import_module("torch_xla.core.xla_model").mark_step()
    return True
