"""A failed stage never costs a trained model: every stage script refuses a bad params.yaml in one
line (exit 2) before it writes anything, and under real DVC the train stage's outputs (persist in
dvc.yaml) outlive a `dvc repro` that fails, while a repro that passes its checks still starts over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, clone_project, run, run_env

STAGES = sorted(path.name for path in (ROOT / "stages").glob("*.py"))


def with_typo(params: Path) -> None:
    """The user's typo: `batchsize` for `batch_size` under train."""
    values = yaml.safe_load(params.read_text())
    values["train"]["batchsize"] = 8
    params.write_text(yaml.safe_dump(values, sort_keys=False))


@pytest.mark.parametrize("script", STAGES)
def test_every_stage_refuses_a_typo_in_one_line_before_writing(script, tmp_path):
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    with_typo(tmp_path / "params.yaml")
    item = ["4096"] if script == "tokenize_corpus.py" else []  # a foreach stage: dvc.yaml passes its vocabulary
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / script), *item],
        cwd=tmp_path,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "batchsize" in done.stderr, (
        done.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"], "the stage wrote before its checks"


def snapshot(project: Path) -> dict[str, bytes]:
    paths = [*(project / "checkpoints" / "run").iterdir(), *(project / "metrics").glob("train*.json")]
    paths += [project / "metrics" / "train_log.csv", project / "metrics" / "summary" / "train.json"]
    return {str(p.relative_to(project)): p.read_bytes() for p in paths}


@pytest.mark.slow
def test_a_failed_dvc_repro_keeps_the_trained_model_and_a_passing_one_starts_over(bounded_repro, tmp_path):
    project = clone_project(bounded_repro[0], tmp_path / "project")
    before = snapshot(project)
    assert any(name.endswith(".pt") for name in before)
    clean = (project / "params.yaml").read_text()

    with_typo(project / "params.yaml")
    failed = run(["dvc", "repro", "-s", "train"], project, check=False)
    assert failed.returncode != 0
    lines = [line for line in (failed.stdout + failed.stderr).splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "batchsize" in lines[0] and "Traceback" not in failed.stderr, failed.stderr
    assert snapshot(project) == before, "the failed repro changed the trained model or its metrics"

    # Fixed, and with a changed schedule: the stage runs its checks, then starts a new run (DVC's
    # semantics before persist), not a refused or silent resume of the kept one.
    values = yaml.safe_load(clean)
    values["train"]["learning_rate"] = 0.02  # the tiny preset's muon recipe trains AdamW's part at 1e-2
    (project / "params.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    run(["dvc", "repro", "-s", "train"], project)
    metrics = json.loads((project / "metrics" / "train.json").read_text())
    assert metrics["status"] == "completed" and not metrics["resumed"]
    assert metrics["final_validation_loss"] != json.loads(before["metrics/train.json"])["final_validation_loss"]
    after = snapshot(project)
    assert not any(after.get(name) == data for name, data in before.items() if name.endswith(".pt"))
    assert "train" not in run(["dvc", "status", "train"], project).stdout  # recorded, up to date
