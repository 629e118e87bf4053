"""The device a run computes on, as one object: everything that depends on the kind of device is
asked of it, so no code outside buildllm/device/ compares kind names."""

from __future__ import annotations

import contextlib
import importlib
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch

from buildllm.device import allocator
from buildllm.device.peak_memory import PeakMemory
from buildllm.errors import DeviceUnavailable

try:
    import resource  # Unix only: the process's own limits
except ImportError:  # Windows
    resource = None


def cpuinfo(*names: str) -> str:
    """The value of the first /proc/cpuinfo line whose name starts with one of `names` ("" off Linux)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        return next((line.split(":", 1)[1].strip() for line in handle if line.startswith(names)), "")
    return ""


def processor_name() -> str:
    if name := cpuinfo("model name"):
        return name
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            command = ["sysctl", "-n", "machdep.cpu.brand_string"]
            return subprocess.run(command, capture_output=True, text=True, timeout=5).stdout.strip()
    return platform.processor() or platform.machine()


def host_free_memory() -> tuple[int, str]:
    """(bytes, source): the host's available memory, or less where this process may not use it all: a
    container's cgroup memory limit, or an address-space or data-size limit (ulimit -v / -d). Running
    into any of them fails an allocation the same way."""
    limits = [(psutil.virtual_memory().available, "available on the host")]
    if (cgroup := _cgroup_room()) is not None:
        limits.append((cgroup, "left under this container's cgroup memory limit"))
    usage = psutil.Process().memory_info()
    rlimits = [("RLIMIT_AS", usage.vms, "-v"), ("RLIMIT_DATA", getattr(usage, "data", 0), "-d")]
    for name, used, flag in rlimits if resource else []:  # named: without `resource` (Windows) nothing is read
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            limits.append((max(0, soft - used), f"left under this process's `ulimit {flag}` limit"))
    return min(limits)


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit, v2 or v1 (None: no limit, or not Linux).
    Inside a container the cgroup's own folder is often mounted at the root: both places are read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, relative = line.split(":", 2)
        if controllers == "":
            root, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            root, files = Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        for folder in (root / relative.lstrip("/"), root):
            with contextlib.suppress(OSError, ValueError):
                limit = (folder / files[0]).read_text().strip()
                if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
                    break
                return max(0, int(limit) - int((folder / files[1]).read_text()))
    return None


@dataclass(frozen=True)
class Device:
    requested: str
    device: str  # what torch is given: "cpu", "cuda:0", "mps", "xla"
    kind: str  # cpu | cuda | mps | xla
    reason: str

    @property
    def index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0

    @property
    def name(self) -> str:
        """The hardware: the GPU's name on CUDA, else the processor's (an Apple GPU is part of it)."""
        return torch.cuda.get_device_name(self.index) if self.kind == "cuda" else processor_name()

    def synchronize(self) -> None:
        """Wait for this device's queued work, so a timer measures the work and not its dispatch."""
        if self.kind == "cuda":
            torch.cuda.synchronize(self.index)
        elif self.kind == "mps":
            torch.mps.synchronize()
        elif self.kind == "xla":
            xm = importlib.import_module("torch_xla.core.xla_model")  # only present on XLA machines
            xm.mark_step()
            xm.wait_device_ops()

    def timed(self) -> float:
        self.synchronize()
        return time.perf_counter()

    def end_step(self) -> None:
        """End an optimizer step's graph on XLA, which records operations and runs them only at a
        boundary: without one per step the graph grows step after step (recompiling, then running
        out of memory). torch_xla.sync() where it exists, the older xm.mark_step() before it."""
        if self.kind != "xla":
            return
        torch_xla = importlib.import_module("torch_xla")
        if callable(getattr(torch_xla, "sync", None)):
            torch_xla.sync()
        else:
            importlib.import_module("torch_xla.core.xla_model").mark_step()

    @property
    def runtime_defaults(self) -> str:
        """Which of a profile's runtime defaults apply: "cpu", or "gpu" for every accelerator
        (Apple and XLA ones too: their memory is the GPU-like constraint)."""
        return "cpu" if self.kind == "cpu" else "gpu"

    @property
    def threads_apply(self) -> bool:
        """The CPU computes with torch's threads: their count sets its speed as much as the batch does."""
        return self.kind == "cpu"

    @property
    def cache_sized_work(self) -> bool:
        """Memory-bound passes run fastest in cache-sized pieces: true of the CPU; an accelerator's
        kernels want large pieces and few launches (the fused loss's chunks, plan/loss_chunk.py)."""
        return self.kind == "cpu"

    @property
    def autocast_type(self) -> str:
        return self.kind

    @property
    def pin_memory(self) -> bool:
        """Page-locked host batches let the copy to a CUDA device run beside compute (non-blocking)."""
        return self.kind == "cuda"

    @property
    def worker_context(self) -> str | None:
        """How data-loader workers start. fork copies a process whose CUDA runtime already runs threads
        (a child may deadlock; torch warns); a forkserver forks them from a fresh single-threaded server
        that never touched CUDA. Elsewhere the platform's default (fork on Linux: fast, and safe)."""
        return "forkserver" if self.kind == "cuda" else None

    def put(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(self.device) for t in tensors)

    def put_pair(self, pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch (Windows.pair: inputs and targets in one contiguous tensor) on this device,
        as (inputs, targets). On CUDA one copy from page-locked memory, queued without waiting
        (non_blocking), so it runs beside the steps still queued; torch's pinned-memory cache keeps
        the host buffer until the copy is done."""
        if self.pin_memory:
            pinned = pair if pair.is_pinned() else pair.pin_memory()
            pair = pinned.to(self.device, non_blocking=True)
        else:
            pair = pair.to(self.device)
        return pair[0], pair[1]

    @property
    def materialises_attention(self) -> bool:
        # Flash and memory-efficient kernels (CUDA, CPU) never store the T x T matrix; the math path
        # used on MPS and XLA does.
        return self.kind in ("mps", "xla")

    @property
    def uses_cublas(self) -> bool:
        """Its matmuls run through cuBLAS, whose per-handle workspaces count in the allocator's peak."""
        return self.kind == "cuda"

    @property
    def saves_like_cuda_kernels(self) -> bool:
        """Backward keeps what CUDA's own kernels save: a fused RMSNorm its input and rstd only, fp32
        attention the memory-efficient kernel's output (memory/estimate.py)."""
        return self.kind == "cuda"

    @property
    def compile_pays_first(self) -> bool:
        """torch.compile moves an accelerator's step far more than the loss chunk or the attention
        kernel do, so tune measures it right after precision (measure/tune_order.py)."""
        return self.kind != "cpu"

    @property
    def caching_allocator(self) -> bool:
        """CUDA's caching allocator reserves more than it hands out: its reserved peak is worth showing."""
        return self.kind == "cuda"

    @property
    def host_memory(self) -> bool:
        """The device's memory is the process's own: its peak is resident memory, allocator and
        runtime included, and running out of it ends the process instead of raising an error."""
        return self.kind == "cpu"

    def peak_memory(self) -> PeakMemory:
        return PeakMemory(self)

    def memory_capacity(self) -> int:
        if self.kind == "cuda":
            return torch.cuda.get_device_properties(self.index).total_memory
        return psutil.virtual_memory().available

    def memory_free(self) -> int:
        free = self.free_memory()[0]
        return psutil.virtual_memory().available if free is None else free

    def free_memory(self) -> tuple[int | None, str]:
        """(bytes this process could still allocate here now, where the figure comes from); None where
        the device does not say (XLA)."""
        if self.kind == "cuda":
            return torch.cuda.mem_get_info(self.index)[0], f"free on {self.device} (cudaMemGetInfo)"
        if self.kind == "mps":
            # Metal's recommended working set is what the GPU may use without paging; the driver holds some.
            room = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
            return room, "MPS's recommended working set less what its driver holds"
        if self.kind == "xla":
            return None, "XLA does not report free memory"
        return host_free_memory()

    def oom_figures(self) -> dict:
        if self.host_memory:
            return {"oom_resident_bytes": psutil.Process().memory_info().rss, "oom_free_bytes": host_free_memory()[0]}
        if self.kind != "cuda":
            return {}
        return {
            "oom_allocated_bytes": torch.cuda.memory_allocated(self.index),
            "oom_reserved_bytes": torch.cuda.memory_reserved(self.index),
            "oom_peak_allocated_bytes": torch.cuda.max_memory_allocated(self.index),
            "oom_device_total_bytes": torch.cuda.get_device_properties(self.index).total_memory,
        }

    def release_cached_memory(self) -> None:
        """Hand the caching allocator's free blocks back, so the next try starts from a clean device."""
        if self.kind == "cuda":
            torch.cuda.empty_cache()
        if self.host_memory:  # the heap's kept blocks (device/allocator.py)
            allocator.release_freed_memory()

    def for_rank(self, local_rank: int, rank: int, size: int, local_size: str = "?") -> Device:
        """This process's own device in a torchrun world: GPU `local_rank` on CUDA, the CPU as it is."""
        if self.kind == "cuda":
            if local_rank >= torch.cuda.device_count():
                raise DeviceUnavailable(
                    f"torchrun started {local_size} processes on this machine but it has "
                    f"{torch.cuda.device_count()} CUDA device(s); set --nproc_per_node to at most that"
                )
            torch.cuda.set_device(local_rank)
            return replace(self, device=f"cuda:{local_rank}", reason=f"{self.reason}; rank {rank} of {size}")
        if self.kind != "cpu":
            raise DeviceUnavailable(
                f"torchrun training supports cuda and cpu, not {self.kind}; run a single process on this device"
            )
        return self

    @property
    def collective_backend(self) -> str:
        """NCCL between GPUs (GPU-to-GPU transfers), gloo on the CPU (the path CI can test)."""
        return "nccl" if self.kind == "cuda" else "gloo"

    @property
    def collective_device(self) -> str:
        """Where collectives' tensors live: NCCL moves only CUDA tensors, gloo only CPU ones."""
        return self.device if self.kind == "cuda" else "cpu"

    @property
    def ddp_device_ids(self) -> list[int] | None:
        return [self.index] if self.kind == "cuda" else None
