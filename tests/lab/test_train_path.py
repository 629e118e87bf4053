"""lab/train_path.py: a real, short `buildllm train` traced from the command line to its first
optimizer step, in a temporary folder that leaves the project alone."""

from __future__ import annotations

import json

import pytest
from train_fixtures import make_token_files, train_args

from lab import train_path


def test_the_trace_follows_a_real_run_to_its_first_optimizer_step(tmp_path, monkeypatch, capsys):
    paths = make_token_files(tmp_path / "tokens")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    flags = train_args(paths, tmp_path / "unused", examples=64)[1:-2]  # the tool names the checkpoint folder
    assert train_path.main(["--json", "--", *flags]) == 0
    phases = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    before, after = phases["before train()"], phases["train() to the first optimizer step"]
    assert before[0] == "buildllm/cli.py" and "buildllm/config.py" in before
    assert after[0] == "buildllm/train/loop.py"
    assert {"buildllm/train/trainer.py", "buildllm/model/gpt.py", "buildllm/plan/run_plan.py"} <= set(after)
    assert len(set(before + after)) == len(before + after)
    # The run card and the compare report are not part of training.
    assert not [m for m in before + after if m.startswith("buildllm/report/")]
    assert list(project.iterdir()) == []


def test_a_folder_that_is_not_the_package_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        train_path.main(["--package", str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
