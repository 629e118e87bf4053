"""Other processes' CPU load at a measurement's start and end: the threshold's arithmetic, and real
competing processes (busy loops on every core this process may use) noticed by the watch and by a
real benchmark, which says so on the console and in its metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import yaml

from buildllm.cli import main
from buildllm.device.load import BUSY_SHARE, LoadWatch, contended_share, our_cpus
from buildllm.metrics import read_metrics


@contextmanager
def competitors(count: int):
    """`count` busy loops that are not this process's children (a shell starts them and exits, so
    they belong to init): to the watch they are other processes, as another job would be."""
    loop = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 </dev/null & echo $!; "
    out = subprocess.run(["sh", "-c", loop * count], check=True, capture_output=True, text=True, timeout=30).stdout
    pids = [int(pid) for pid in out.split()]
    try:
        time.sleep(0.5)  # let them start spinning
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "others, used, available, share",
    [
        (0.0, 2, 2, 0.0),  # idle machine
        (0.5, 2, 2, 0.25),  # half a core taken from a run on both cores: at the threshold, not over it
        (1.0, 2, 2, 0.5),
        (3.0, 1, 4, 0.0),  # three other cores busy, one left for the run: no contention
        (3.5, 1, 4, 0.5),
        (8.0, 2, 4, 1.0),  # capped: every core the run needs is taken
        (0.3, 0, 2, 0.0),  # an accelerator run still counts the one core that feeds it
    ],
)
def test_contended_share_fills_idle_cores_first(others, used, available, share):
    assert contended_share(others, used, available) == pytest.approx(share)
    assert (contended_share(others, used, available) > BUSY_SHARE) == (share > BUSY_SHARE)


def test_busy_loops_on_every_core_are_noticed_at_start_and_end():
    cores = len(our_cpus())
    with competitors(cores):
        watch = LoadWatch(used=cores)
        figures = watch.end()
    # Each loop spins a core; whatever else runs, those cores are busy and not ours.
    assert figures["other_load_start"] > 0.6 * cores and figures["other_load_end"] > 0.6 * cores, figures
    assert figures["busy_machine"] is True and figures["contended_share"] > BUSY_SHARE
    assert "busy machine: other processes used" in figures["busy_machine_reason"]


def test_a_benchmark_on_a_busy_machine_says_so(tokens, workdir, capsys):
    (workdir / "params.yaml").write_text(
        yaml.safe_dump({"benchmark": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1}})
    )
    command = [
        "benchmark",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--batch-size",
        "8",
        "--training-examples",
        "32",
        "--validation-examples",
        "8",
    ]
    with competitors(len(our_cpus())):
        assert main(command) == 0
    m = read_metrics(workdir / "metrics" / "benchmark.json", with_notes=True)
    assert m["busy_machine"] is True and m["other_load_start"] > 0.5 and m["cores_used"] == 1
    assert m["busy_machine_reason"].startswith("busy machine:")
    assert "warning: busy machine: other processes used" in capsys.readouterr().err
    # Over the measured window itself too, not only at its two ends.
    assert m["other_load_window"] > 0.5


def test_a_training_run_samples_others_load_and_says_so_beside_the_verdict(tokens, workdir, capsys):
    """A real run with busy loops on every core it may use: the log rows' samples see them, the metrics
    say busy and by how much, and the console's last line says it."""
    from train_fixtures import train_args

    with competitors(len(our_cpus())):
        assert main(train_args(tokens, workdir / "run", "--log-interval", "2")) == 0
    m = read_metrics(workdir / "metrics" / "train.json", with_notes=True)
    assert m["busy_machine"] is True and m["other_load_mean"] > 0.5 and m["load_samples"] >= 10
    assert m["busy_time_share"] > 0.5 and m["cores_used"] == 1 and m["other_load_max"] >= m["other_load_mean"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "busy machine: other processes used" in last and f"{m['other_load_mean']:.2f} cores on average" in last
