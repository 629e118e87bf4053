"""Which device a run uses, and why (a Device, with its reason).

`auto` picks cuda, then mps, then cpu. An explicitly requested device this machine lacks fails at
once with what is missing and what to do; nothing silently falls back to another device.
"""

from __future__ import annotations

import torch

from buildllm.device import available
from buildllm.device.device import Device
from buildllm.errors import DeviceUnavailable


def resolve_device(requested: str) -> Device:
    if requested == "auto":
        best = available.best_device()
        if best == "cuda:0":
            name = torch.cuda.get_device_name(0)
            return Device(requested, best, "cuda", f"auto: CUDA is available ({name}); cuda is preferred")
        no_cuda = f"no CUDA ({available.why_no_cuda()})"
        if best == "mps":
            return Device(requested, best, "mps", f"auto: {no_cuda}; Apple MPS is available")
        return Device(requested, best, "cpu", f"auto: {no_cuda} and no Apple MPS; using the CPU")
    if requested.startswith("cuda"):
        return _resolve_cuda(requested)
    if requested == "mps" and not available.mps_available():
        raise DeviceUnavailable(
            "device mps requested but Apple MPS is not available here (it needs an Apple-silicon Mac "
            "with a PyTorch built for macOS); use --device cpu for bounded work or --device auto"
        )
    if requested == "xla" and not available.xla_available():
        raise DeviceUnavailable(
            "device xla requested but torch_xla is not installed; install torch_xla on a TPU machine, "
            "or use --device cpu for bounded work"
        )
    if requested in ("cpu", "mps"):
        return Device(requested, requested, requested, "requested explicitly")
    if requested == "xla":
        return Device(requested, "xla", "xla", "requested explicitly (torch_xla is installed)")
    raise DeviceUnavailable(f"unknown device {requested!r}; use auto, cpu, cuda, cuda:N, mps or xla")


def _resolve_cuda(requested: str) -> Device:
    if not torch.cuda.is_available():
        raise DeviceUnavailable(
            f"device {requested} requested but CUDA is not available: {available.why_no_cuda()}; "
            "use --device cpu for bounded work, or install a CUDA build of PyTorch on a machine with an NVIDIA GPU"
        )
    index = int(requested.split(":")[1]) if ":" in requested else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailable(
            f"device {requested} requested but this machine has {count} CUDA device(s) "
            f"(cuda:0..cuda:{count - 1}); pick one of those or use --device cuda"
        )
    name = torch.cuda.get_device_name(index)
    return Device(requested, f"cuda:{index}", "cuda", f"requested explicitly ({name})")
