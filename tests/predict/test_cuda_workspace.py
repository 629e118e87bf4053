"""The CUDA memory estimate counts cuBLAS's workspaces, which PyTorch allocates through its caching
allocator (so max_memory_allocated counts them). No GPU here: the device's compute capability is
monkeypatched, the one thing this machine cannot have."""

from __future__ import annotations

import pytest
import torch

from buildllm.device.device import Device
from buildllm.memory.estimate import cublas_workspace_bytes, estimate_training_memory
from buildllm.profiles import load_profile

MiB = 2**20
CUDA = Device("cuda", "cuda:0", "cuda", "test")
CPU = Device("cpu", "cpu", "cpu", "test")


def estimate(device):
    model = load_profile("gpt_first_cpu").model
    return estimate_training_memory(model, 1_334_016, 8, 2, device, loss_chunk_rows=1024)


def test_workspace_config_strings_sum_their_chunks():
    assert cublas_workspace_bytes(":4096:8") == 32 * MiB
    assert cublas_workspace_bytes(":4096:2:16:8") == 8 * MiB + 128 * 1024
    assert cublas_workspace_bytes(":16:8") == 128 * 1024


@pytest.mark.parametrize("capability, per_workspace", [((9, 0), 32 * MiB), ((8, 0), 8 * MiB + 128 * 1024)])
def test_two_workspaces_of_the_gpus_default_size(monkeypatch, capability, per_workspace):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    on_cuda = estimate(CUDA)
    # forward on the Python thread, backward on the autograd engine's device thread: two handles
    assert on_cuda.workspace == 2 * per_workspace
    metrics = on_cuda.as_metrics()
    assert metrics["memory_estimate_workspace_bytes"] == 2 * per_workspace
    summed = {f"memory_estimate_{name}_bytes" for name in ("total", "low", "high")}
    assert sum(v for k, v in metrics.items() if k not in summed) == on_cuda.total
    assert estimate(CPU).workspace == 0


def test_cublas_workspace_config_overrides_the_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the deterministic-mode setting
    assert estimate(CUDA).workspace == 2 * 128 * 1024
