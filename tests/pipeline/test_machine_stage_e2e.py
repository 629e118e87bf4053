"""Real DVC: the measurement stages depend on the machine. On the same machine a second `dvc repro`
skips them (the machine stage reruns but writes the same bytes; preflight rechecks the machine now
without making train rerun); with another machine's fingerprint (BUILDLLM_MACHINE_OVERRIDE) they
measure again (one runs, DVC's status names the rest), and the stages that do not depend on the
machine stay cached."""

from __future__ import annotations

import json

import pytest
from conftest import clone_project, run

pytestmark = pytest.mark.slow
MEASURED = ("dry_run", "benchmark", "estimate", "preflight", "train")


def ran(out: str) -> set[str]:
    names = ("machine", "corpus", "tokenize", *MEASURED)  # tokenize: any of its vocabularies (tokenize@4096)
    return {stage for stage in names if any(f"Running stage '{stage}{end}" in out for end in "'@")}


def test_same_machine_keeps_the_cache_another_machine_measures_again(bounded_repro, tmp_path, monkeypatch):
    # The session's bounded pipeline (conftest's bounded_repro), whose first `dvc repro` ran every
    # stage on this machine; this test works on its own clone of it.
    source, first = bounded_repro
    assert ran(first) == {"machine", "corpus", "tokenize", *MEASURED}, first
    project = clone_project(source, tmp_path / "project")
    monkeypatch.delenv("BUILDLLM_MACHINE_OVERRIDE", raising=False)
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
    # One measuring stage runs on the other machine; DVC's status names the others it would run again
    # (running them as well took about 30 s more on 2 cores and shows what the status shows).
    other = run(["dvc", "repro", "benchmark"], project).stdout
    assert ran(other) == {"machine", "benchmark"}, other
    status = run(["dvc", "status"], project).stdout
    changed = {line.strip().rstrip(":") for line in status.splitlines() if line and not line.startswith("\t")}
    assert changed == set(MEASURED) - {"benchmark"} | {"machine", "report"}, status
    record = json.loads((project / "metrics" / "machine.json").read_text())
    assert record["cpu_model"] == "Test Chip 64" and record["machine_override"] is True
    assert json.loads((project / "metrics" / "benchmark.json").read_text())["machine_id"] == record["machine_id"]
