"""End to end with real DVC: `dvc repro benchmark estimate` on a fresh copy of the project (corpus
and tokenize stages included), then two experiments whose metrics diff shows the speed and memory
deltas between fp32 and bf16 on the CPU."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run

pytestmark = pytest.mark.slow


def bound(project) -> None:
    """Small enough for CI: preset tiny on one CPU thread, a few steps, a few examples."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(device="cpu", preset="tiny")
    params["train"].update(threads=1, batch_size=8, training_examples=64, validation_examples=16)
    params["benchmark"].update(warmup_steps=1, measured_steps=4, intervals=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_repro_then_experiments_diff_speed_and_memory(project, tmp_path, monkeypatch):
    bound(project)
    run(["dvc", "repro", "benchmark", "estimate"], project)
    benchmark = json.loads((project / "metrics" / "benchmark.json").read_text())
    estimate = json.loads((project / "metrics" / "estimate.json").read_text())
    assert benchmark["profile"] == "tiny" and benchmark["oom"] is False and benchmark["tokens_per_second"] > 0
    assert estimate["planned_optimizer_steps"] == 64 // 8 and estimate["estimated_seconds"] > 0
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "bounded benchmark"], project)

    # Named cpu-...: a bare "bf16" would also read as an abbreviated git object id.
    for precision in ("fp32", "bf16"):
        run(
            ["dvc", "exp", "run", "-n", f"cpu-{precision}", "-S", f"precision={precision}", "benchmark", "estimate"],
            project,
        )
    # DVC's own diff: the stages' summaries, and a full record when it is named.
    diff = json.loads(run(["dvc", "metrics", "diff", "cpu-fp32", "cpu-bf16", "--json"], project).stdout)
    changes = diff["metrics/summary/benchmark.json"]
    for key in ("tokens_per_s", "peak_mib"):
        assert isinstance(changes[key]["diff"], (int, float)), (key, changes.get(key))
        assert changes[key]["old"] > 0 and changes[key]["new"] > 0
    assert "metrics/summary/estimate.json" in diff
    full = json.loads(
        run(
            ["dvc", "metrics", "diff", "cpu-fp32", "cpu-bf16", "--targets", "metrics/benchmark.json", "--json"], project
        ).stdout
    )["metrics/benchmark.json"]
    for key in ("tokens_per_second", "steps_per_second", "peak_memory_bytes"):
        assert isinstance(full[key]["diff"], (int, float)), (key, full.get(key))
    # Each experiment really ran in its precision: its commit holds its full record (a stage output).
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    revs = [rev for baseline in shown for exp in baseline.get("experiments") or [] for rev in exp["revs"]]
    for precision in ("fp32", "bf16"):
        rev = next(rev for rev in revs if rev.get("name") == f"cpu-{precision}")
        record = json.loads(run(["git", "show", f"{rev['rev']}:metrics/benchmark.json"], project).stdout)
        assert record["precision"] == precision
