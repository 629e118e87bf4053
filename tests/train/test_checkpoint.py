"""Checkpoint files, the directory lock and the resume decision, without training."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from train_fixtures import train_args

from buildllm.device.rng import rng_state
from buildllm.errors import UserError
from buildllm.train import checkpoint

SIGNATURE = {"batch_size": 16, "epochs": 1, "model.n_layer": 2}


def state(step: int, signature: dict = SIGNATURE) -> dict:
    return {"step": step, "model": {"w": torch.full((64, 64), float(step))}, "signature": dict(signature)}


def test_saves_are_whole_files_and_only_the_newest_are_kept(tmp_path):
    for step in (2, 4, 6, 8):
        seconds, size, path = checkpoint.save(tmp_path, state(step), keep=2)
        assert path.name == f"checkpoint_{step:08d}.pt" and size == path.stat().st_size and seconds >= 0
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "checkpoint_00000006.pt",
        "checkpoint_00000008.pt",
    ]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_00000006.pt", "checkpoint_00000008.pt"]  # no temp files


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    checkpoint.save(tmp_path, state(2), keep=3)
    checkpoint.save(tmp_path, state(4), keep=3)
    newest = tmp_path / "checkpoint_00000004.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # what a non-atomic writer killed mid-write would leave
    path, loaded = checkpoint.load_latest(tmp_path)
    assert path.name == "checkpoint_00000002.pt" and loaded["step"] == 2
    assert capsys.readouterr().err == (
        f"warning: checkpoint_00000004.pt in {tmp_path} is damaged (truncated: 100 bytes, "
        "the end of the file is missing); trying the one before it, "
        "checkpoint_00000002.pt\n"
    )


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "empty: a save that never wrote anything"),
        (bytes(range(256)) * 4, "not a checkpoint: its 1,024 bytes are not a PyTorch file"),
    ],
)
def test_a_damaged_file_is_named_as_such_without_torchs_advice(tmp_path, content, why):
    (tmp_path / "checkpoint_00000002.pt").write_bytes(content)
    with pytest.raises(checkpoint.DamagedCheckpoint) as caught:
        checkpoint.load(tmp_path / "checkpoint_00000002.pt")
    assert str(caught.value) == (
        f"checkpoint {tmp_path / 'checkpoint_00000002.pt'} is damaged ({why}); use another "
        "checkpoint or rerun into a fresh --checkpoint-directory"
    )
    assert "weights_only" not in str(caught.value)


def test_a_file_of_other_objects_is_refused_without_loading_it_unsafely(tmp_path):
    torch.save({"step": 2, "model": SimpleNamespace(w=1)}, tmp_path / "checkpoint_00000002.pt")
    with pytest.raises(
        checkpoint.DamagedCheckpoint,
        match=r"\(not a BuildLLM checkpoint: it holds objects other "
        r"than tensors and plain values\)",
    ):
        checkpoint.load(tmp_path / "checkpoint_00000002.pt")
    assert checkpoint.load_latest(tmp_path) is None


def test_resume_decision(tmp_path):
    assert checkpoint.state_to_resume(tmp_path / "new", SIGNATURE, resume=False, force=False) is None
    with pytest.raises(UserError, match="--resume given but .* holds no checkpoint"):
        checkpoint.state_to_resume(tmp_path / "new", SIGNATURE, resume=True, force=False)
    checkpoint.save(tmp_path / "run", state(4), keep=2)
    (tmp_path / "run" / ".checkpoint_00000006.pt.abc123.tmp").write_bytes(b"half a save")
    assert checkpoint.state_to_resume(tmp_path / "run", SIGNATURE, resume=False, force=False)["step"] == 4
    assert checkpoint.foreign_files(tmp_path / "run") == [] and len(os.listdir(tmp_path / "run")) == 1
    other = {**SIGNATURE, "epochs": 3}
    with pytest.raises(UserError, match=r"different schedule \(epochs 1 -> 3\)"):
        checkpoint.state_to_resume(tmp_path / "run", other, resume=True, force=False)
    assert checkpoint.state_to_resume(tmp_path / "run", other, resume=True, force=True)["step"] == 4
    with pytest.raises(UserError, match="different model .* even with --force"):
        checkpoint.state_to_resume(tmp_path / "run", {**SIGNATURE, "model.n_layer": 4}, resume=True, force=True)


def test_the_lock_refuses_a_second_process_while_the_first_lives(tokens, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with checkpoint.DirectoryLock(tmp_path / "run"):
        with pytest.raises(UserError, match=f"in use by pid {os.getpid()}"):
            checkpoint.DirectoryLock(tmp_path / "run").acquire()
        second = subprocess.run(
            [sys.executable, "-m", "buildllm", *train_args(tokens, tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint directory {tmp_path / 'run'} in use by pid {os.getpid()}; wait for that run to finish "
        "or stop it, or use another --checkpoint-directory"
    )
    assert not (tmp_path / "run" / checkpoint.LOCK).exists() and checkpoint.list_checkpoints(tmp_path / "run") == []


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_file = tmp_path / checkpoint.LOCK
    lock_file.write_text(f"{dead.stdout.strip()} 0.000 {socket.gethostname()}\n")
    with checkpoint.DirectoryLock(tmp_path):
        assert lock_file.read_text().split()[0] == str(os.getpid())
    assert f"taking over the stale lock {lock_file} (pid {dead.stdout.strip()}" in capsys.readouterr().err
    assert not lock_file.exists()


def test_a_lock_of_another_host_is_refused_and_says_how_to_clear_it(tmp_path):
    """Whether another host's run lives cannot be checked from here: refused, never taken over, with the
    way out for a run that is gone; this host's own live run gets no such advice (the test above)."""
    lock_file = tmp_path / checkpoint.LOCK
    lock_file.write_text("4242 0.000 another-machine\n")
    with pytest.raises(UserError) as refused:
        checkpoint.DirectoryLock(tmp_path).acquire()
    assert str(refused.value) == (
        f"checkpoint directory {tmp_path} in use by pid 4242 on host another-machine; wait for that run to "
        f"finish or stop it, or use another --checkpoint-directory; if that run is gone, delete {lock_file} "
        "and rerun"
    )
    assert lock_file.read_text() == "4242 0.000 another-machine\n"


def test_the_same_state_saved_twice_gives_the_same_bytes(tmp_path):
    """A real model and optimizer state with the RNG state: equal states must give equal files."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    full = {
        "step": 3,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": rng_state(),
        "signature": dict(SIGNATURE),
    }
    _, _, first = checkpoint.save(tmp_path / "a", full, keep=2)
    _, _, second = checkpoint.save(tmp_path / "b", full, keep=2)
    assert first.read_bytes() == second.read_bytes()
    assert b".tmp" not in first.read_bytes()  # the temp file's random name is not inside
    assert checkpoint.load(first)["step"] == 3
