"""Measured peak memory of the work between a probe's creation (Device.peak_memory()) and read(). CUDA:
the allocator's own peak. CPU: the growth of the peak resident set (RSS); on Linux the kernel's
high-water mark (VmHWM) is reset at the start, so only the measured work counts; elsewhere a thread
samples RSS. MPS: the driver's allocated memory, sampled, since MPS keeps no peak of its own."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading
from pathlib import Path

import psutil
import torch

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def _vm_hwm() -> int | None:
    with contextlib.suppress(OSError):
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def _reset_hwm() -> bool:
    try:
        CLEAR_REFS.write_text("5")  # "5": reset the peak RSS to the current RSS
        return True
    except OSError:
        return False


def _return_freed_memory() -> None:
    """glibc keeps freed heap memory for reuse (up to 32 MiB after large blocks were freed) and hands
    it out again without the resident set growing: work before the start (the peak-FLOP/s matmuls,
    building the model) would hide part of the measured work's growth. Measured: the iteration-1
    benchmark read 113 MiB after those matmuls, a fresh process 150-170 MiB for the same steps.
    Trimming first makes the baseline live memory only. Not glibc (macOS, musl): nothing to do."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    def __init__(self, device):
        self.device = device  # a buildllm.device.Device
        self._stop = threading.Event()
        self._kernel_hwm = False
        if device.kind == "cuda":
            device.synchronize()
            torch.cuda.reset_peak_memory_stats(device.index)
            self.baseline = torch.cuda.memory_allocated(device.index)
            self.method = "cuda: torch.cuda.max_memory_allocated growth (reserved reported beside it)"
            return
        if device.kind == "mps":
            current = torch.mps.driver_allocated_memory
            self.method = "mps: torch.mps.driver_allocated_memory growth, sampled"
        else:
            # Building an optimizer imports torch._dynamo on first use: about 70 MiB of code. Imported
            # before the baseline, so the growth counts the run's tensors and not torch's modules.
            importlib.import_module("torch._dynamo")
            _return_freed_memory()
            process = psutil.Process()
            current = lambda: process.memory_info().rss  # noqa: E731
            self._kernel_hwm = _reset_hwm() and _vm_hwm() is not None
            self.method = (
                "cpu: peak RSS growth (VmHWM reset at start)"
                if self._kernel_hwm
                else "cpu: peak RSS growth, sampled every 5 ms"
            )
        self.baseline = current()
        self._sampled_peak = self.baseline
        if not self._kernel_hwm:
            self._thread = threading.Thread(target=self._sample, args=(current,), daemon=True)
            self._thread.start()

    def _sample(self, current) -> None:
        while not self._stop.wait(0.005):
            self._sampled_peak = max(self._sampled_peak, current())

    def read(self) -> dict:
        if self.device.kind == "cuda":
            self.device.synchronize()
            allocated = torch.cuda.max_memory_allocated(self.device.index)
            return {
                "peak_memory_bytes": allocated - self.baseline,
                "peak_memory_allocated_bytes": allocated,
                "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(self.device.index),
                "peak_memory_method": self.method,
            }
        if self._kernel_hwm:
            peak = _vm_hwm() or 0
        else:
            self._stop.set()
            self._thread.join()
            peak = self._sampled_peak
        return {"peak_memory_bytes": max(0, peak - self.baseline), "peak_memory_method": self.method}
