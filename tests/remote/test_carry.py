"""`buildllm carry` refuses, in one line, to carry what a clone would not reproduce: uncommitted
changes, or outputs that differ from the committed dvc.lock. (What it carries, and the route it
serves: tests/remote/test_git_route_e2e.py.)"""

from __future__ import annotations

import sys

from conftest import run


def carry(project, into):
    return run([sys.executable, "-m", "buildllm", "carry", "--into", str(into)], project, check=False)


def test_an_uncommitted_workspace_or_missing_outputs_are_refused(project, tmp_path):
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("seed: 1337", "seed: 7"))
    done = carry(project, tmp_path / "carry")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "uncommitted changes (params.yaml); commit the first run's results" in done.stderr
    run(["git", "checkout", "params.yaml"], project)
    # Committed, but never reproduced: the corpus and token files a clone would pull do not exist.
    done = carry(project, tmp_path / "carry")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the outputs of corpus, tokenize@16384, tokenize@4096 differ from dvc.lock or are missing" in done.stderr
    assert not (tmp_path / "carry").exists()
