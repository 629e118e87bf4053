"""Running out of memory on the CPU takes CUDA's path: the course's advice in one line, `oom` in the
metrics, the last good checkpoint kept, no traceback. Real: `buildllm train` in a child process whose
address space is capped (RLIMIT_AS, as `ulimit -v` does), so torch's CPU allocator fails for real."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
import yaml
from conftest import run_env
from train_fixtures import train_args

# Room left above the process's own footprint after its imports: far less than the plan's estimate.
HEADROOM = 900 * 2**20


def footprint() -> int:
    """The address space a `buildllm train` process holds once it has imported everything it runs."""
    code = "import psutil, buildllm.train.trainer, buildllm.cli; print(psutil.Process().memory_info().vms)"
    return int(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=run_env()).stdout
    )


def capped(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return preexec


@pytest.mark.slow  # three fresh processes importing torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS caps allocations only on Linux")
def test_an_allocation_failure_on_the_cpu_is_one_line_with_the_advice(tokens, tmp_path):
    # Eight blocks at batch 1536 x 64 tokens: an estimated peak of several GiB.
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"model": {"n_layer": 8}}))
    command = [
        sys.executable,
        "-m",
        "buildllm",
        *train_args(tokens, tmp_path / "run", "--batch-size", "1536", "--workers", "0", examples=1536),
    ]
    limit = footprint() + HEADROOM
    refused = subprocess.run(
        command,
        cwd=tmp_path,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=capped(limit),
        check=False,
    )
    # The won't-fit check sees the cap first (free memory is what the cap leaves) and refuses.
    assert refused.returncode == 2 and "left under this process's `ulimit -v` limit" in refused.stderr
    assert not (tmp_path / "run").exists()
    forced = subprocess.run(
        [*command, "--force-memory"],
        cwd=tmp_path,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=capped(limit),
        check=False,
    )
    errors = [line for line in forced.stderr.splitlines() if line.startswith("error:")]
    assert forced.returncode == 3, forced.stderr
    assert "Traceback" not in forced.stderr and len(errors) == 1, forced.stderr
    assert errors[0].startswith("error: cpu ran out of memory at step 1 with batch size 1536 (the process held ")
    assert "reduce --batch-size (e.g. --batch-size 768)" in errors[0] and "no checkpoint had been saved" in errors[0]
    metrics = json.loads((tmp_path / "metrics" / "train.json").read_text())
    assert metrics["status"] == "out_of_memory" and metrics["oom"] is True and metrics["oom_batch_size"] == 1536
    assert metrics["oom_resident_bytes"] > 0 and metrics["oom_free_bytes"] < HEADROOM
    assert metrics["memory_fits"] is False and metrics["force_memory"] is True
