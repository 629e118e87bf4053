"""`buildllm import-runs` is all or nothing, also under kill -9: the import is killed (a real SIGKILL
of the real process) at each of its phases, and the next `buildllm` command puts the workspace, HEAD
and the experiment refs back as they were before it; run again, it imports every run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clone_project, copy_project, run, run_env

from buildllm.remote import archive

pytestmark = pytest.mark.slow
# The import's named points (buildllm/remote/import_journal.py stop_at), then a kill inside `dvc exp
# save` itself, the moment it has detached HEAD to commit.
PHASES = ["inside-dvc", "journal", "written", "saved", "restored"]


def runs_archive(project: Path, path: Path) -> Path:
    """Two runs: each changes the tracked params.yaml and brings an untracked dvc.lock and metrics
    files, one in a folder the workspace lacks."""
    params = (project / "params.yaml").read_bytes().replace(b"seed: 1337", b"seed: 7")
    assert params != (project / "params.yaml").read_bytes()
    runs = [
        archive.Run(
            name,
            ["machine"],
            ["seed=7"],
            {
                "params.yaml": params,
                "dvc.lock": b"schema: '2.0'\nstages: {}\n",
                "metrics/machine.json": f'{{"machine_id": "m-{name}"}}\n'.encode(),
                "metrics/summary/machine.json": b"{}\n",
            },
            1.0,
        )
        for name in ("one", "two")
    ]
    archive.write(path, runs)
    return path


def state(project: Path) -> dict:
    git = lambda *args: run(["git", *args], project, check=False).stdout  # noqa: E731
    return {
        "status": git("status", "--porcelain"),
        "head": git("symbolic-ref", "-q", "HEAD"),
        "refs": git("for-each-ref", "refs/exps", "refs/stash"),
        "stashes": git("stash", "list"),  # the user's own stash, below any the import pushed
        "params": (project / "params.yaml").read_bytes(),
    }


def experiments(project: Path) -> set[str]:
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    return {exp["name"] for commit in shown for exp in commit.get("experiments") or [] if exp.get("name")}


def import_killed_at(project: Path, path: Path, phase: str) -> int:
    command = [sys.executable, "-m", "buildllm", "import-runs", str(path)]
    if phase != "inside-dvc":
        env = {**run_env(), "BUILDLLM_TEST_KILL_AT": phase}
        return subprocess.run(command, cwd=project, env=env, capture_output=True, timeout=600).returncode
    process = subprocess.Popen(command, cwd=project, env=run_env(), start_new_session=True)
    head, deadline = project / ".git" / "HEAD", time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        if not head.read_text().startswith("ref:"):  # DVC is committing the experiment
            os.killpg(process.pid, signal.SIGKILL)  # the import and its `dvc exp save`, as kill -9 on both
            break
        time.sleep(0.002)
    return process.wait()


def test_a_killed_import_is_rolled_back_at_the_next_start_and_then_imports_whole(tmp_path):
    base = copy_project(tmp_path / "base")
    (base / ".dvc" / ".gitignore").write_text("/config.local\n/tmp\n/cache\n")  # as `dvc init` commits it
    run(["git", "add", "-A"], base)
    run(["git", "commit", "-qm", "DVC's own .gitignore"], base)
    (base / "README.txt").write_text("draft\n")
    run(["git", "stash", "push", "-q", "--include-untracked", "-m", "the user's own"], base)
    (base / "notes.txt").write_text("a user's untracked file\n")
    path = runs_archive(base, tmp_path / "runs.tar.gz")
    for phase in PHASES:
        project = clone_project(base, tmp_path / phase)
        before = state(project)
        assert import_killed_at(project, path, phase) == -signal.SIGKILL, phase
        if phase in ("written", "saved", "inside-dvc"):  # the kill struck while the workspace held a run
            assert state(project) != before, phase
        started = run([sys.executable, "-m", "buildllm", "--help"], project)
        assert "was stopped before it finished" in started.stderr, (phase, started.stderr)
        assert "nothing of it was imported" in started.stderr and started.stderr.count("\n") == 1
        assert state(project) == before, phase
        assert experiments(project) == set(), phase
    project = tmp_path / "inside-dvc"  # the import again where DVC itself was killed (its locks, its temp files)
    before = state(project)
    done = run([sys.executable, "-m", "buildllm", "import-runs", str(path)], project)
    assert "experiment two" in done.stdout
    assert experiments(project) == {"one", "two"} and state(project)["status"] == before["status"]

    # --force replaces experiments: killed after it replaced `one`, the old `one` comes back.
    before = state(project)
    env = {**run_env(), "BUILDLLM_TEST_KILL_AT": "saved"}
    killed = subprocess.run([*done.args, "--force"], cwd=project, env=env, capture_output=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL and state(project)["refs"] != before["refs"]
    run([sys.executable, "-m", "buildllm", "--help"], project)
    assert state(project) == before
