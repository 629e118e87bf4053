"""The DVC train stage's new run (buildllm/train/checkpoint.py start_over): DVC keeps the stage's
outputs (persist), so the stage itself clears the directory, and only once its checks have passed."""

from __future__ import annotations

import pytest

from buildllm.errors import UserError
from buildllm.train import checkpoint


def test_start_over_clears_all_but_the_lock_and_refuses_resume_before_clearing(tmp_path):
    (tmp_path / "checkpoint_00000008.pt").write_bytes(b"weights")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    (tmp_path / checkpoint.LOCK).write_text("1 0 host\n")
    with pytest.raises(UserError, match="train.resume is true, but `dvc repro train` starts a new run"):
        checkpoint.start_over(tmp_path, resume=True)
    assert (tmp_path / "checkpoint_00000008.pt").read_bytes() == b"weights"  # refused: nothing went
    checkpoint.start_over(tmp_path, resume=False)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.LOCK]
