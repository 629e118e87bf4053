"""Real DVC: the measurement stages depend on the machine. On the same machine a second `dvc repro`
skips them (the machine stage reruns but writes the same bytes; preflight rechecks the machine now
without making train rerun); with another machine's fingerprint (BUILDLLM_MACHINE_OVERRIDE) they
measure again, and the stages that do not depend on the machine stay cached."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run, use_docs_corpus

pytestmark = pytest.mark.slow
MEASURED = ("dry_run", "benchmark", "estimate", "preflight", "train")


def bound(project) -> None:
    """Small enough for CI: preset tiny on one CPU thread, a few steps, a few examples."""
    use_docs_corpus(project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(device="cpu", preset="tiny")
    params["train"].update(threads=1, batch_size=8, training_examples=64, validation_examples=16)
    params["benchmark"].update(warmup_steps=1, measured_steps=4, intervals=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def ran(out: str) -> set[str]:
    return {stage for stage in ("machine", "corpus", "tokenize", *MEASURED) if f"Running stage '{stage}'" in out}


def test_same_machine_keeps_the_cache_another_machine_measures_again(project, monkeypatch):
    monkeypatch.delenv("BUILDLLM_MACHINE_OVERRIDE", raising=False)
    bound(project)
    first = run(["dvc", "repro"], project).stdout
    assert ran(first) == {"machine", "corpus", "tokenize", *MEASURED}, first
    machine = (project / "metrics" / "machine.json").read_bytes()
    trained = (project / "metrics" / "train.json").read_bytes()

    again = run(["dvc", "repro"], project).stdout
    # always_changed: machine and preflight run every time; nothing they feed changed.
    assert ran(again) == {"machine", "preflight"}, again
    for stage in ("dry_run", "benchmark", "estimate", "train"):
        assert f"Stage '{stage}' didn't change, skipping" in again, (stage, again)
    assert (project / "metrics" / "machine.json").read_bytes() == machine
    assert (project / "metrics" / "train.json").read_bytes() == trained
    assert "free disk at the checkpoint directory" in again  # the machine's state now was checked

    monkeypatch.setenv("BUILDLLM_MACHINE_OVERRIDE", json.dumps({"cpu_model": "Test Chip 64", "logical_cores": 64}))
    other = run(["dvc", "repro"], project).stdout
    assert ran(other) == {"machine", *MEASURED}, other
    record = json.loads((project / "metrics" / "machine.json").read_text())
    assert record["cpu_model"] == "Test Chip 64" and record["machine_override"] is True
    assert json.loads((project / "metrics" / "benchmark.json").read_text())["machine_id"] == record["machine_id"]
