"""buildllm/device/allocator.py: a training process on the host keeps its freed blocks, so a step's
large tensors reuse the last step's pages instead of faulting in fresh ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

from buildllm.device import allocator

# A child process each: the thresholds are process-wide and cannot be put back.
FAULTS = """
import resource, sys, torch
from buildllm.config import load_config
from buildllm.plan.run_plan import apply_plan, make_plan
if sys.argv[1] == "plan":
    apply_plan(make_plan(load_config(None, {"preset": "tiny", "device": "cpu", "train.training_examples": 64})))
for _ in range(3):  # 64 MiB, allocated and freed before counting: the heap settles around it
    torch.ones(16 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(16 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not allocator.glibc(), reason="the thresholds are glibc's")
def test_a_cpu_plan_keeps_freed_blocks_so_the_next_allocation_faults_no_fresh_pages():
    pages = (64 << 20) // 4096
    # Without the plan glibc gives a 64 MiB block back on free: each of ten allocations faults in every page.
    assert faults("plain") > 8 * pages
    # With the plan's thresholds the block stays in the heap and the allocations reuse its pages (a small
    # object carved from the freed block can push one allocation to fresh pages: at most one in ten).
    assert faults("plan") < 2 * pages


def test_the_decision_is_recorded_and_only_the_host_raises_the_thresholds():
    keep, why = allocator.decide(host_memory=False)
    assert not keep and "device's own allocator" in why
    keep, why = allocator.decide(host_memory=True)
    assert keep == allocator.glibc() and why  # this test process runs uncapped


@pytest.mark.skipif(not allocator.glibc(), reason="the thresholds are glibc's")
def test_under_an_address_space_cap_glibc_keeps_its_defaults():
    # A kept heap holds address space the cap counts even after malloc_trim: after an out-of-memory
    # nothing could be loaded to write the record.
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (64 << 30, 64 << 30)); "
        "from buildllm.device import allocator; print(allocator.decide(True))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("(False,") and "capped (64.0 GiB, `ulimit -v`)" in done.stdout
