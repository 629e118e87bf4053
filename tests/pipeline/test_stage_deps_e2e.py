"""The DVC graph, tried as a student would: after `dvc repro`, edit one file of the package and ask
`dvc status` which stages changed. A stage reruns for the code it runs and for nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import clone_project, run

pytestmark = pytest.mark.slow


def changed(project: Path) -> set[str]:
    # tokenize@4096 counts as tokenize: the stages of one foreach share their code.
    status = json.loads(run(["dvc", "status", "--json"], project).stdout or "{}")
    return {stage.split(":")[-1].split("@")[0] for stage in status}


def always_changed(project: Path) -> set[str]:
    """The stages dvc.yaml marks always_changed (the machine's record, the preflight checks): they
    rerun at every repro by design, whatever was edited."""
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    return {name for name, stage in stages.items() if stage.get("always_changed")}


def changed_after_editing(project: Path, relative: str) -> set[str]:
    """Stages `dvc status` says changed after a comment is added to one file (then taken out again),
    beside those that always change."""
    path = project / relative
    original = path.read_text()
    path.write_text(original + "\n# a student's note\n")
    try:
        return changed(project) - always_changed(project)
    finally:
        path.write_text(original)


def test_an_edit_reruns_only_the_stages_that_run_the_edited_code(bounded_repro, tmp_path):
    project = clone_project(bounded_repro[0], tmp_path / "project")
    assert changed(project) == always_changed(project), "right after the repro only those always changed"
    model = changed_after_editing(project, "buildllm/model/gpt.py")
    assert not model & {"corpus", "tokenize"}, f"the corpus and tokenizer do not run the model: {model}"
    assert {"dry_run", "benchmark", "train"} <= model, model

    assert changed_after_editing(project, "buildllm/cli.py") == set(), "a help text reruns no stage"
    assert changed_after_editing(project, "buildllm/report/run_card.py") == {"report"}
    assert changed_after_editing(project, "buildllm/data/corpus.py") >= {"corpus", "tokenize"}
