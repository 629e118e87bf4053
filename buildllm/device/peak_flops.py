"""Peak FLOP/s of the device a run uses, in the run's precision: the denominator of MFU.

Measured by the run itself on every device: large matmuls in the run's dtype (and thread count, and
TF32 setting), warmed, then timed (with CUDA events on CUDA, so the figure is the kernels' own time).
The MFU a run reports is against that peak, what this device delivers to a matmul now: on an H200
an 8192^3 bf16 matmul ran at 769-798 TFLOP/s against the datasheet's 989.4 (2026-12-04), so an MFU
against the datasheet reads about a fifth lower than what the step's kernels leave unused.
Known NVIDIA GPUs also have their datasheet figure (dense, no sparsity) recorded beside it
(`peak_flops_datasheet`, `mfu_datasheet`), the figure the course's targets name. Nothing is cached
outside the project: the metrics file records both peaks and their sources, so each MFU can be
recomputed from that file alone, and no other run's history (or a file DVC cannot see) moves it.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from dataclasses import dataclass

import torch

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
            return Peak(peaks[key] * TERA, f"datasheet: {pattern} {key}")  # dense figures
    return None


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GPU_WARMUP_MATMULS = 10


def matmul_size(device) -> int:
    # Large enough to reach the matmul units' rate, small enough to take well under a second.
    return 2048 if device.kind == "cpu" else 8192


class MatmulProbe:
    """Timed size^3 matmuls in the run's dtype and threads, on buffers made once: probing between a
    benchmark's measured steps then allocates nothing, so the run's measured peak memory stays
    its own. Each sample's rates are kept in `samples`, in order."""

    def __init__(self, device, precision: str):
        self.device, self.size = device, matmul_size(device)
        dtype = DTYPES[precision]
        self.a = torch.randn(self.size, self.size, device=device.device, dtype=dtype)
        self.b = torch.randn(self.size, self.size, device=device.device, dtype=dtype)
        self.out = torch.matmul(self.a, self.b)  # the first call pays for kernel selection and allocation
        # A GPU's clocks rise under load: a few untimed matmuls first (a few ms each at 8192^3).
        for _ in range(GPU_WARMUP_MATMULS if device.kind == "cuda" else 0):
            torch.matmul(self.a, self.b, out=self.out)
        device.synchronize()
        self.samples: list[list[float]] = []

    def sample(self, repeats: int = 1) -> list[float]:
        taken = []
        for _ in range(repeats):
            taken.append(2 * self.size**3 / self.seconds())
        self.samples.append(taken)
        return taken

    def seconds(self) -> float:
        """One matmul's time: on CUDA between two events on its stream (the kernel's own time, no
        launch or synchronisation latency), elsewhere the wall clock around it and a synchronize."""
        if self.device.kind == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(self.a, self.b, out=self.out)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000
        start = time.perf_counter()
        torch.matmul(self.a, self.b, out=self.out)
        self.device.synchronize()
        return time.perf_counter() - start

    def close(self) -> None:
        del self.a, self.b, self.out
        self.device.release_cached_memory()  # the matmul's blocks must not count in the run's reserved memory


def step_probe(device, precision: str) -> MatmulProbe | None:
    """A probe a benchmark keeps through its measured steps, or None: where the device's memory
    is the run's budget (GPUs: 768 MiB of fp32 matmul buffers at 8192^3) holding it would shrink
    that budget and the benchmark would no longer fit what training fits, so there the peak is
    sampled before and after the steps instead (sample_peak). On the CPU it holds 48 MiB of 24 GiB."""
    return MatmulProbe(device, precision) if device.host_memory else None


def sample_peak(device, precision: str) -> list[float]:
    """One in-run sample of the matmul rate (FLOP/s, 5 timed matmuls) in the run's dtype and threads."""
    with contextlib.closing(MatmulProbe(device, precision)) as probe:
        return probe.sample(5)


def datasheet_peak(device, precision: str, tf32: bool) -> Peak | None:
    """The datasheet's figure for this GPU and precision, recorded beside the measured peak; None
    off CUDA or for a GPU not in the table."""
    return table_peak(device.name, precision, tf32) if device.kind == "cuda" else None


def measured_peak(device, precision: str, rates: list[float]) -> Peak:
    """The median of a run's own timed matmuls (`rates`), in its dtype and thread count.

    The median, not the best: a typical rate under the same conditions as the steps, so a steady
    background load slows numerator and denominator alike, where the best of a few would be one
    lucky moment that a rerun does not repeat (MFU must agree between two runs within 3%)."""
    timer = " (CUDA events)" if device.kind == "cuda" else ""
    return Peak(statistics.median(rates), f"measured: {matmul_size(device)}^3 {precision} matmuls{timer}")
