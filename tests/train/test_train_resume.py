"""Crash-proof checkpoints: kill -9 a training process at a random step and again in the middle of a
checkpoint save, rerun the same command, and get weights bitwise equal to an uninterrupted run."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from train_fixtures import same_tensors, train_args

from buildllm.train import checkpoint

pytestmark = pytest.mark.slow
STEPS = 40  # 640 examples in batches of 16


@pytest.fixture(scope="module")
def paths(tokens):
    return tokens  # the session's token files (tests/conftest.py), read only


@pytest.fixture(scope="module", params=["adamw", "muon"])
def optimizer(request) -> str:
    """Each test runs with AdamW alone and with Muon + AdamW: a resume restores both optimizers' state."""
    return request.param


def command(paths, directory: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "buildllm", *train_args(paths, directory, *extra, examples=STEPS * 16)]


def finish(paths, directory: Path, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command(paths, directory, *extra), cwd=directory.parent, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_state(directory: Path) -> dict:
    return checkpoint.load(directory / checkpoint.checkpoint_name(STEPS))


def assert_bitwise_equal(straight: dict, resumed: dict) -> None:
    for part in ("model", "optimizer", "cursor", "rng"):
        assert same_tensors(straight[part], resumed[part]) == [], part
    assert (straight["step"], straight["tokens_seen"]) == (resumed["step"], resumed["tokens_seen"])


def wait_for(condition, process: subprocess.Popen, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError("training made no progress")


@pytest.fixture(scope="module")
def straight(paths, optimizer, tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("straight") / "run"
    finish(paths, directory, "--optimizer", optimizer)
    return final_state(directory)


def test_kill_at_a_random_step_then_resume_is_bitwise_equal(paths, optimizer, straight, tmp_path):
    directory = tmp_path / "run"
    kill_after = random.Random().randrange(2, STEPS - 4, 2)  # a different step every run, as a crash would be
    process = subprocess.Popen(
        command(paths, directory, "--optimizer", optimizer),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    landed = wait_for(lambda: (directory / checkpoint.checkpoint_name(kill_after)).exists(), process)
    process.kill()
    process.wait()
    assert landed, f"the run finished before step {kill_after}"
    assert checkpoint.list_checkpoints(directory)[-1].name != checkpoint.checkpoint_name(STEPS)
    result = finish(paths, directory, "--optimizer", optimizer)
    assert "taking over the stale lock" in result.stderr and "resuming from" in result.stderr
    assert_bitwise_equal(straight, final_state(directory))


def temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if checkpoint.TEMP.match(p.name)] if directory.is_dir() else []


def kill_inside_a_save(paths, directory: Path, optimizer: str) -> bool:
    """Freeze the process when a save's temp file appears; if the rename has not happened yet, kill it."""
    process = subprocess.Popen(
        command(paths, directory, "--checkpoint-interval", "1", "--optimizer", optimizer),
        cwd=directory.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watched = psutil.Process(process.pid)
    try:
        while wait_for(lambda: temp_files(directory), process):
            process.send_signal(signal.SIGSTOP)
            while watched.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                time.sleep(0.001)
            # A save with an earlier checkpoint beside it: the kill must leave that one whole.
            if temp_files(directory) and checkpoint.list_checkpoints(directory):
                process.kill()
                return True
            process.send_signal(signal.SIGCONT)
        return False
    finally:
        process.kill()
        process.wait()


def test_kill_during_a_checkpoint_save_then_resume_is_bitwise_equal(paths, optimizer, straight, tmp_path):
    directory = tmp_path / "run"
    for _ in range(3):  # each save is a few milliseconds; the freeze lands inside one almost always
        if kill_inside_a_save(paths, directory, optimizer):
            break
        for leftover in directory.iterdir():
            leftover.unlink()
    else:
        pytest.fail("no kill landed inside a checkpoint save in 3 runs")
    assert temp_files(directory), "the half-written save is still there"
    assert (directory / checkpoint.LOCK).exists()
    saved = checkpoint.list_checkpoints(directory)
    assert saved and all(checkpoint.load(path)["step"] < STEPS for path in saved)  # the previous ones are whole
    result = finish(paths, directory, "--optimizer", optimizer)
    assert "removed 1 temp file(s) of a checkpoint save that was interrupted" in result.stderr
    assert temp_files(directory) == []
    assert_bitwise_equal(straight, final_state(directory))
