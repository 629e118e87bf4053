"""What this machine's torch can reach, facts only: CUDA (or why not), Apple MPS, torch_xla."""

from __future__ import annotations

import importlib.util

import torch


def why_no_cuda() -> str:
    if torch.version.cuda is None:
        return "this PyTorch is a CPU-only build (torch.version.cuda is None)"
    return "PyTorch has CUDA support but found no usable NVIDIA GPU or driver"


def mps_available() -> bool:
    return torch.backends.mps.is_available()


def xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def best_device() -> str:
    """The device `auto` resolves to: cuda:0, then mps, then cpu (buildllm/plan/device.py says why)."""
    if torch.cuda.is_available():
        return "cuda:0"
    return "mps" if mps_available() else "cpu"
