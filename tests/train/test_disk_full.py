"""A disk that fills: a save that does not fit ends in one line with the figures, the temp file
removed, and the earlier checkpoints and metrics intact.

The real case runs on a small tmpfs (mounted here when the test runs as root and the kernel allows
it); the errno path runs everywhere by making the write fail with ENOSPC."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
import torch
from fs_faults import small_disk
from train_fixtures import train_args

from buildllm import disk
from buildllm.atomic import atomic_write_text
from buildllm.cli import main
from buildllm.train import checkpoint
from buildllm.train.trainer import Trainer


@pytest.fixture(scope="module")
def paths(tokens):
    return tokens  # the session's token files (tests/conftest.py), read only


def fill_at(monkeypatch, at_step: int, folder, leave: int) -> None:
    """Before optimizer step `at_step`, another program takes all but `leave` bytes of the disk."""
    original = Trainer.step

    def step(self):
        if self.step_count + 1 == at_step:
            self.wait_for_save()  # after the save before it is on disk (saves run beside the steps)
            with open(folder / "filler.bin", "wb") as handle:
                handle.write(b"\0" * max(0, disk.free_bytes(folder) - leave))
        return original(self)

    monkeypatch.setattr(Trainer, "step", step)


def test_a_disk_that_fills_during_a_save_gives_one_line_and_keeps_earlier_checkpoints(
    paths, workdir, monkeypatch, capsys
):
    with small_disk(workdir / "small", 24) as small:
        run = small / "run"
        fill_at(monkeypatch, 5, small, leave=256 * 1024)
        code = main(train_args(paths, run))
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert code != 0
        assert error.startswith("error: disk full: writing checkpoint_00000006.pt needs about ")
        assert f" in {run} but only " in error and "2 earlier checkpoint(s) there are intact" in error
        assert "Traceback" not in error and "inline_container" not in error
        assert sorted(os.listdir(run)) == ["checkpoint_00000002.pt", "checkpoint_00000004.pt"]  # no temp, no lock
        assert checkpoint.load(run / "checkpoint_00000004.pt")["step"] == 4
        rows = (workdir / "metrics" / "train_log.csv").read_text().splitlines()
        assert rows[-1].startswith("6,")  # the log up to the step before the save, whole


def test_enospc_during_a_save_is_reported_with_the_figures(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, {"step": 2, "model": {"w": torch.zeros(256, 256)}}, keep=2)
    real_save = torch.save

    def full(obj, handle, *args, **kwargs):
        handle.write(b"PK" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 4096)
    with pytest.raises(disk.DiskFull) as caught:
        checkpoint.save(tmp_path, {"step": 4, "model": {"w": torch.zeros(256, 256)}}, keep=2)
    message = str(caught.value)
    assert message.startswith("disk full: writing checkpoint_00000004.pt needs about ")
    assert 256 * 1024 <= caught.value.needed < 300 * 1024 and caught.value.free == 4096  # the tensors, or the last save
    assert f"in {tmp_path} but only 4.0 KiB (4,096 bytes) is free there" in message
    assert "1 earlier checkpoint(s) there are intact" in message
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert os.listdir(tmp_path) == ["checkpoint_00000002.pt"]
    assert checkpoint.load(tmp_path / "checkpoint_00000002.pt")["step"] == 2


def test_a_metrics_write_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "train.json"
    target.write_text(json.dumps({"a": 1}))

    def full(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(target), "write_text", full)
    with pytest.raises(disk.DiskFull, match=r"disk full: writing train.json needs about 8 B \(8 bytes\)"):
        atomic_write_text(target, '{"a": 2}')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["train.json"]


def test_a_run_its_disk_cannot_hold_is_refused_before_training(paths, workdir, capsys):
    with small_disk(workdir / "small", 12) as small:  # the tiny preset: 3 checkpoints of ~7.3 MiB do not fit
        assert main(train_args(paths, small / "run")) == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: not enough disk space for this run: {small / 'run'} has ")
    assert re.search(
        r"but the run needs about 2[1-3]\.\d MiB \([\d,]+ bytes\): 2 kept \+ 1 being written, "
        r"3 new × 7\.\d MiB, \+ [\d.]+ KiB of logs; free some space",
        error,
    )
    assert not (workdir / "metrics" / "train.json").exists()


def test_the_free_space_probe_decides_and_a_resume_counts_what_is_there(paths, workdir, monkeypatch, capsys):
    free = {"bytes": 10 * 2**20}
    monkeypatch.setattr(disk, "free_bytes", lambda path: free["bytes"])
    assert main(train_args(paths, workdir / "run")) == 2
    error = capsys.readouterr().err
    assert "has 10.0 MiB (10,485,760 bytes) free but the run needs about 2" in error
    assert checkpoint.list_checkpoints(workdir / "run") == [] and not (workdir / "metrics" / "train.json").exists()
    free["bytes"] = 2**40
    assert main(train_args(paths, workdir / "run", "--epochs", "1", examples=64)) == 0  # 4 steps, 2 kept
    assert len(checkpoint.list_checkpoints(workdir / "run")) == 2
    free["bytes"] = 8 * 2**20  # one more checkpoint fits: the two kept are already on disk
    assert main(train_args(paths, workdir / "run", "--epochs", "2", "--force", examples=64)) == 0
