"""`buildllm env`: what this machine offers for training, and why a device is or isn't usable. The
same flat record goes into the benchmark's metrics (the course's "what to record" list)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform

import psutil
import torch

from buildllm import __version__
from buildllm.device import cpu_bf16
from buildllm.device.available import mps_available, why_no_cuda, xla_available
from buildllm.device.device import Device, processor_name
from buildllm.device.machine import fingerprint, machine_id, machine_label


def machine_name(device: Device) -> str:
    """What a speed was measured on (the GPU on CUDA, else the processor), shortened as
    metrics/machine.json names it. The estimate refuses a benchmark whose machine differs from the plan's."""
    return machine_label(device.name)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(device: Device) -> dict:
    """One flat record of the machine and the device a run resolved (the GPU described is that one)."""
    memory = psutil.virtual_memory()
    cuda = torch.cuda.is_available()
    native = cpu_bf16.native_bf16()
    gpu = torch.cuda.get_device_properties(device.index if device.kind == "cuda" else 0) if cuda else None
    return {
        "buildllm_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "torch_cuda_version": torch.version.cuda or "none (CPU-only build)",
        "cuda_available": cuda,
        "cuda_unavailable_reason": "" if cuda else why_no_cuda(),
        "cuda_device_count": torch.cuda.device_count() if cuda else 0,
        "mps_available": mps_available(),
        "xla_available": xla_available(),
        "processor": processor_name(),
        "physical_cores": psutil.cpu_count(logical=False) or 0,
        "logical_cores": psutil.cpu_count(logical=True) or 0,
        "cpu_affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": memory.total,
        "memory_available_bytes": memory.available,
        "gpu_name": gpu.name if gpu else "",
        "gpu_memory_bytes": gpu.total_memory if gpu else 0,
        "gpu_compute_capability": f"{gpu.major}.{gpu.minor}" if gpu else "",
        # On a CPU only where it has a bf16 matmul path (device/cpu_bf16.py).
        "bf16_supported": (gpu.major, gpu.minor) >= (8, 0) if gpu else native,
        "dvc_version": _version("dvc"),
        "tokenizers_version": _version("tokenizers"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16_native": native,
        "resolved_device": device.device,
        "device_reason": device.reason,
        "machine": machine_name(device),
        "machine_id": machine_id(fingerprint()),
    }


def print_environment(device: Device, as_json: bool = False) -> None:
    """`buildllm env` for the device the plan resolved (buildllm/plan/device.py)."""
    info = environment(device)
    if as_json:
        print(json.dumps(info, indent=2))
        return
    gib = 2**30
    lines = [
        f"BuildLLM {info['buildllm_version']}, Python {info['python_version']}, {info['platform']}",
        f"PyTorch {info['torch_version']} (CUDA build: {info['torch_cuda_version']})",
        f"CUDA available: {'yes' if info['cuda_available'] else 'no — ' + info['cuda_unavailable_reason']}",
    ]
    if info["cuda_available"]:
        lines.append(
            f"GPU: {info['gpu_name']}, {info['gpu_memory_bytes'] / gib:.1f} GiB, compute capability "
            f"{info['gpu_compute_capability']}, bf16 {'yes' if info['bf16_supported'] else 'no'}"
        )
    lines += [
        f"Apple MPS available: {'yes' if info['mps_available'] else 'no'}; torch_xla: "
        f"{'yes' if info['xla_available'] else 'no'}",
        f"Processor: {info['processor']}; {info['physical_cores']} physical / {info['logical_cores']} logical cores; "
        f"torch uses {info['torch_threads']} threads; vector ISA {info['cpu_capability']}, bf16 matmul path "
        f"{'yes' if info['cpu_bf16_native'] else 'no (bf16 is refused on this CPU)'}",
        f"Memory: {info['memory_total_bytes'] / gib:.1f} GiB total, "
        f"{info['memory_available_bytes'] / gib:.1f} GiB available",
        f"Resolved device: {info['resolved_device']} ({info['device_reason']})",
        f"dvc {info['dvc_version']}, tokenizers {info['tokenizers_version']}",
    ]
    print("\n".join(lines))
