"""Device resolution: which device a run uses, and why.

`auto` picks cuda, then mps, then cpu. An explicitly requested device this machine lacks fails at
once with what is missing and what to do; nothing silently falls back to another device.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass

import torch

from buildllm.errors import DeviceUnavailable


@dataclass(frozen=True)
class DeviceDecision:
    requested: str
    device: str  # what torch is given: "cpu", "cuda:0", "mps", "xla"
    kind: str  # cpu | cuda | mps | xla
    reason: str

    @property
    def index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0


def why_no_cuda() -> str:
    if torch.version.cuda is None:
        return "this PyTorch is a CPU-only build (torch.version.cuda is None)"
    return "PyTorch has CUDA support but found no usable NVIDIA GPU or driver"


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def resolve_device(requested: str) -> DeviceDecision:
    if requested == "auto":
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            return DeviceDecision(requested, "cuda:0", "cuda", f"auto: CUDA is available ({name}); cuda is preferred")
        if mps_available():
            return DeviceDecision(requested, "mps", "mps", f"auto: no CUDA ({why_no_cuda()}); Apple MPS is available")
        return DeviceDecision(requested, "cpu", "cpu",
                              f"auto: no CUDA ({why_no_cuda()}) and no Apple MPS; using the CPU")
    if requested == "cpu":
        return DeviceDecision(requested, "cpu", "cpu", "requested explicitly")
    if requested.startswith("cuda"):
        return _resolve_cuda(requested)
    if requested == "mps":
        if not mps_available():
            raise DeviceUnavailable(
                "device mps requested but Apple MPS is not available here (it needs an Apple-silicon Mac "
                "with a PyTorch built for macOS); use --device cpu for bounded work or --device auto")
        return DeviceDecision(requested, "mps", "mps", "requested explicitly")
    if requested == "xla":
        if not xla_available():
            raise DeviceUnavailable(
                "device xla requested but torch_xla is not installed; install torch_xla on a TPU machine, "
                "or use --device cpu for bounded work")
        return DeviceDecision(requested, "xla", "xla", "requested explicitly (torch_xla is installed)")
    raise DeviceUnavailable(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N, mps or xla")


def _resolve_cuda(requested: str) -> DeviceDecision:
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {requested} requested but CUDA is not available: {why_no_cuda()}; "
            "use --device cpu for bounded work, or install a CUDA build of PyTorch on a machine with an NVIDIA GPU")
    index = int(requested.split(":")[1]) if ":" in requested else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailable(
            f"device {requested} requested but this machine has {count} CUDA device(s) "
            f"(cuda:0..cuda:{count - 1}); pick one of those or use --device cuda")
    name = torch.cuda.get_device_name(index)
    return DeviceDecision(requested, f"cuda:{index}", "cuda", f"requested explicitly ({name})")


def synchronize(device: DeviceDecision | str) -> None:
    """Wait for queued device work, so a timer measures the work and not its dispatch."""
    kind = device.kind if isinstance(device, DeviceDecision) else torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()
    elif kind == "xla":
        import torch_xla.core.xla_model as xm  # only present on XLA machines

        xm.mark_step()
        xm.wait_device_ops()


def timed(device: DeviceDecision | str) -> float:
    """A timestamp taken after the device has finished its queued work."""
    synchronize(device)
    return time.perf_counter()
