"""The README's walkthrough, run as written: every ```bash block marked `<!-- walkthrough -->` is taken
from README.md itself and run line by line, in order, with real DVC in a temporary copy of the project
whose params.yaml is bounded (the README says how). Each command's stated outcome is checked, and after
every command the workspace is still on the defaults (params.yaml unchanged). On a machine without
CUDA, the CUDA lines must print the one-line refusal and leave the workspace's files as they were."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import ROOT, copy_project, run

pytestmark = pytest.mark.slow

MARKER = "<!-- walkthrough -->"
REFUSAL = "CUDA is not available"
WIDTH = 160


def walkthrough(text: str) -> list[str]:
    """The commands of the marked blocks, in order (a trailing backslash continues a line)."""
    commands = []
    for block in re.findall(re.escape(MARKER) + r"\s*```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]
    return commands


def bound(project: Path) -> None:
    """The sizes the README states for this test: preset tiny, 64 examples, a 5-step benchmark."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["preset"] = "tiny"
    params["train"].update(training_examples=64, validation_examples=16, log_interval=2, eval_interval=2)
    params["benchmark"].update(warmup_steps=1, measured_steps=4, intervals=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (project / "README.md").write_text((ROOT / "README.md").read_text())
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "bounded params for the README walkthrough"], project)


def files(project: Path) -> dict:
    return {p.relative_to(project).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((project / "metrics").rglob("*")) if p.is_file()}


def lines(result) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def wait_for_queue(project: Path, result) -> None:
    """`dvc queue status`: "wait until none is Queued or Running"; none may have failed."""
    deadline = time.monotonic() + 600
    while re.search(r"\b(Queued|Running)\b", result.stdout) and time.monotonic() < deadline:
        time.sleep(3)
        result = run(["dvc", "queue", "status"], project)
    assert not re.search(r"\b(Queued|Running|Failed)\b", result.stdout), result.stdout


def check(command: str, result, project: Path) -> None:
    """The outcome the README states for each command; a command with no stated outcome fails the test,
    so a new README command comes with its check."""
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    if command.startswith("buildllm env"):
        assert "Resolved device:" in out
    elif command.startswith("buildllm dry-run"):
        assert json.loads(result.stdout.splitlines()[0])["action"] == "dry_run" and "parameters" in out
    elif command.startswith("dvc repro tokenize"):
        assert list((project / "data" / "tokens").glob("*/train_tokens.pt"))
    elif command.startswith("dvc repro dry_run"):
        assert (project / "metrics" / "dry_run.json").exists()
    elif command.startswith("git add dvc.lock"):
        assert run(["git", "status", "--porcelain", "dvc.lock", "metrics"], project).stdout == ""
    elif command.startswith(("dvc exp run --temp", "dvc exp run --queue", "dvc queue start", "git checkout")):
        pass  # the exit code (checked by the caller); the runs are read by the commands after them
    elif command.startswith("dvc queue status"):
        wait_for_queue(project, result)
    elif command.startswith("dvc metrics show"):
        rows = result.stdout.splitlines()
        assert rows[0].startswith("Path") and max(len(row) for row in rows) <= WIDTH, out
        assert any(row.startswith("metrics/summary/") for row in rows[1:]), out
    elif command.startswith("dvc metrics diff"):
        # One row per metric that differs, and every row fits a terminal.
        assert "| Path" in out and max(len(line) for line in result.stdout.splitlines()) <= WIDTH, out
        # Without --targets the stages' summaries (short names); with one, that stage's full record.
        assert ("estimated_seconds" if "estimate.json" in command else "tokens_per_s") in out
    elif command.startswith("buildllm compare"):
        target = re.search(r"--out (\S+)", command)
        assert (project / f"{target.group(1) if target else 'reports/comparison'}.md").exists(), out
    elif command.startswith("dvc repro train"):
        metrics = json.loads((project / "metrics" / "train.json").read_text())
        assert metrics["status"] == "completed" and metrics["unigram_validation_loss"] > 0
    elif command.startswith("buildllm generate"):
        startup, text = result.stdout.split("\n", 1)
        assert json.loads(startup)["action"] == "generate" and text.startswith("The history of")
    else:
        raise AssertionError(f"README walkthrough command with no stated outcome in this test: {command}")


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    commands = walkthrough((ROOT / "README.md").read_text())
    assert len(commands) >= 15 and any("cuda" in c for c in commands)
    names = [m for c in commands for m in re.findall(r"-n (\S+)", c)]
    assert len(names) == len(set(names)), f"experiment names used twice: {names}"
    project = copy_project(tmp_path / "project")
    bound(project)
    defaults = (project / "params.yaml").read_text()
    cuda = torch.cuda.is_available()
    for command in commands:
        before = files(project)
        result = run(["bash", "-c", command], project, check=False, timeout=600)
        out = result.stdout + result.stderr
        if "cuda" in command and not cuda:
            # The stated one-line refusal, once, and the workspace as it was.
            assert result.returncode != 0, f"{command}\n{out}"
            refusals = [line for line in lines(result) if REFUSAL in line]
            assert len(refusals) == 1 and refusals[0].startswith("error: device cuda requested"), f"{command}\n{out}"
            assert files(project) == before, command
        else:
            assert result.returncode == 0, f"{command} exited {result.returncode}\n{out}"
            check(command, result, project)
        # The next step starts from the defaults: no command leaves other params behind.
        assert (project / "params.yaml").read_text() == defaults, f"{command} changed params.yaml"
