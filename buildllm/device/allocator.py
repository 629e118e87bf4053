"""Host memory freed by one step, kept for the next: glibc's thresholds raised for a training process.

A CPU step frees the same large tensors it allocates again in the next step (activations, gradients,
the loss chunk's buffers). glibc hands blocks over its mmap threshold back to the kernel when they are
freed, and trims the top of its heap once enough of it is free, so the next step gets fresh pages, and
every fresh page is a page fault and a page the kernel zeroes: getrusage's minor faults counted
about 4,000-5,000 a step at iteration 1 on a 2-core EPYC, and about 40 with the thresholds raised
(a step about 3% faster there). With both thresholds raised, freed blocks stay in the heap and the
next step reuses them. The resident set stays near the step's peak between steps, which is what a
training process holds anyway, and the heap keeps the holes a step's frees leave: the memory
estimate's allocator share (memory/estimate.py) is fitted with this setting on, and `buildllm verify
memory` checks it so.

Linux with glibc only: other C libraries and other systems keep their own allocator's behaviour, and the
plan's record says so. Not under an address-space cap (`ulimit -v`, RLIMIT_AS): a kept block still
holds its address space after malloc_trim gives its pages back, so after an out-of-memory the cap
would leave no room to load what writes the record (the loss plot's libraries).

Both thresholds together: setting either one turns off glibc's dynamic threshold, and the trim
threshold alone drops the mmap threshold back to 128 KiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Above the largest block a step of the CPU profiles frees (the 100M model's fp32 gradients: 0.5 GiB).
KEEP_BYTES = 1 << 30


def glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def decide(host_memory: bool) -> tuple[bool, str]:
    """Whether apply_plan raises the thresholds (host_memory: the device's memory is the process's own,
    Device.host_memory), and why, for the plan's record."""
    if not host_memory:
        return False, "the device's own allocator: host memory holds no step's tensors"
    if not glibc():
        return False, f"the C library's own allocator: the thresholds are glibc's, and this is {sys.platform}"
    import resource  # POSIX only; glibc() has ruled the rest out

    cap = resource.getrlimit(resource.RLIMIT_AS)[0]
    if cap != resource.RLIM_INFINITY:
        return False, (
            f"glibc's defaults: the address space is capped ({cap / 2**30:.1f} GiB, `ulimit -v`), and kept blocks "
            "would hold it after an out-of-memory"
        )
    return True, (
        "glibc keeps freed blocks up to 1 GiB for reuse (mmap and trim thresholds raised): "
        "a step reuses the last step's pages instead of faulting in fresh zeroed ones"
    )


@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


@functools.cache
def keep_freed_memory() -> None:
    """Once per process. mallopt returns 0 for a value it refuses; then glibc keeps its defaults."""
    libc().mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)
    libc().mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)


def release_freed_memory() -> None:
    """After running out of memory: the failed step's freed blocks go back to the kernel, or the kept
    heap would leave no room (under a `ulimit -v` cap, not even the address space) to write the record."""
    if glibc():
        libc().malloc_trim(0)
