"""Peak FLOP/s of the device a run uses, in the run's precision: the denominator of MFU.

Known NVIDIA GPUs: dense (no sparsity) tensor-core figures from NVIDIA's datasheets, by name and
dtype. Everything else (CPUs, Apple GPUs, GPUs not in the table): measured with a short large
matmul in the run's dtype and thread count, and cached per machine. A table that knows only the
A100 gets MFU wrong everywhere else; a measured peak is right for the machine in front of you.
A Device answers with Device.peak_flops(); `device` below is that Device.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from buildllm.atomic import atomic_write_text

TERA = 1e12
# name pattern -> {dtype: dense TFLOP/s}; "tf32" is the rate for fp32 matmuls with TF32 allowed.
# Patterns match whole words of torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3"), most specific first.
GPU_PEAKS = {
    r"H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    r"H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    r"H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},  # SXM (HBM3) and NVL
    r"A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    r"L40S": {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6},
    r"L40": {"bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5},
    r"L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    r"A10G": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    r"A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    r"RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    r"RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    r"V100": {"fp16": 125.0, "fp32": 15.7},
    r"T4": {"fp16": 65.0, "fp32": 8.1},
}


@dataclass(frozen=True)
class Peak:
    flops: float
    source: str


def table_peak(gpu_name: str, precision: str, tf32: bool) -> Peak | None:
    key = "tf32" if precision == "fp32" and tf32 else precision
    for pattern, peaks in GPU_PEAKS.items():
        if re.search(rf"\b{pattern}\b", gpu_name, re.IGNORECASE) and key in peaks:
            return Peak(peaks[key] * TERA, f"table: NVIDIA datasheet, {pattern} {key} dense")
    return None


def cache_file() -> Path:
    root = os.environ.get("BUILDLLM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "buildllm")
    return Path(root) / "peak_flops.json"


def measure_matmul_peak(device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best FLOP/s of size^3 matmuls; the best of several runs is the least disturbed one."""
    a = torch.randn(size, size, device=device.device, dtype=dtype)
    b = torch.randn(size, size, device=device.device, dtype=dtype)
    torch.matmul(a, b)  # first call pays for kernel selection and allocation
    device.synchronize()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        device.synchronize()
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def measured_peak(device, precision: str, threads: int) -> Peak:
    """Measure now, and keep the best figure this machine has ever shown for the same key.

    A busy machine can only make a matmul slower, never faster, so the best measurement is the
    closest to the true peak; measuring again each run (well under a second) lets the cache improve.
    """
    size = 2048 if device.kind == "cpu" else 8192
    key = f"{device.kind}|{device.name}|{precision}|{threads} threads|{size}|torch {torch.__version__}"
    path = cache_file()
    cache = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}  # a damaged cache is re-measured, never trusted
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    now = measure_matmul_peak(device, dtype, size)
    best = cache.get(key, {"flops": 0.0})
    if now > best["flops"]:
        best = cache[key] = {"flops": now, "date": time.strftime("%Y-%m-%d")}
        try:
            atomic_write_text(path, json.dumps(cache, indent=2))
        except OSError:
            pass  # a read-only home still gets this run's measurement
    return Peak(best["flops"], f"measured: {size}^3 {precision} matmul on {threads} threads, best seen "
                               f"{best['flops'] / TERA:.3f} TFLOP/s ({best['date']}, cached in {path}); "
                               f"this run {now / TERA:.3f}")


def peak_flops(device, precision: str, tf32: bool, threads: int) -> Peak:
    if device.kind == "cuda":
        known = table_peak(device.name, precision, tf32)
        if known is not None:
            return known
    return measured_peak(device, precision, threads)
