"""`buildllm verify estimate` and the train metrics' record of where a real run fell against the
estimate's range: a real run judged, a recorded run outside its range exits 1, and training
against an estimate of the same plan (and only the same plan) records its position."""

from __future__ import annotations

import json

import pytest
from train_fixtures import read, train_args

from buildllm.cli import main


def test_a_training_run_records_where_it_fell_against_an_estimate_of_its_plan(tokens, workdir, capsys):
    # An estimate of this very plan (20 steps of tiny, batch 16) whose range no real run can meet.
    plan = {
        "profile": "tiny",
        "device": "cpu",
        "precision": "fp32",
        "batch_size": 16,
        "grad_accum": 1,
        "planned_optimizer_steps": 20,
        "estimated_seconds": 0.002,
        "estimated_seconds_low": 0.001,
        "estimated_seconds_high": 0.003,
    }
    (workdir / "metrics").mkdir()
    (workdir / "metrics" / "estimate.json").write_text(json.dumps(plan))
    assert main(train_args(tokens, workdir / "run")) == 0
    trained = read(workdir / "metrics" / "train.json")
    assert trained["estimate_position"] == "above" and trained["run_seconds"] > trained["train_seconds"] > 0
    assert trained["estimate_ratio"] == pytest.approx(trained["run_seconds"] / 0.002)
    assert "estimate: this run took" in capsys.readouterr().out
    # An estimate of another plan is not this run's: nothing recorded.
    (workdir / "metrics" / "estimate.json").write_text(json.dumps({**plan, "batch_size": 8}))
    assert main(train_args(tokens, workdir / "other")) == 0
    assert "estimate_position" not in read(workdir / "metrics" / "train.json")


@pytest.mark.slow
def test_the_bounded_check_runs_benchmark_estimate_and_train_and_a_recorded_miss_exits_1(check_params, workdir):
    folder = workdir / "kept"
    # The bounded form's smallest benchmark that still has intervals for a range (its defaults are 3 +
    # 20 steps in 4 intervals), and a training run 4 x its 5 steps: what is judged is the same.
    bounded = ["--warmup-steps", "1", "--measured-steps", "4", "--intervals", "2", "--factor", "4"]
    code = main(["verify", "estimate", "--params", str(check_params), *bounded, "--keep", str(folder)])
    record = read(workdir / "metrics" / "verify_estimate.json")
    trained = read(folder / "metrics" / "train.json")
    estimated = read(folder / "metrics" / "estimate.json")
    # What train recorded is what the check judged, and the exit code follows it.
    assert trained["estimate_position"] == record["estimate_position"]
    assert record["run_seconds"] == trained["run_seconds"]
    assert estimated["estimated_seconds_low"] < estimated["estimated_seconds"] < estimated["estimated_seconds_high"]
    assert code == (0 if record["estimate_position"] == "inside" else 1) and record["verdict"] in ("inside", "miss")
    # The same recorded run against a range that ends before it began: a miss, exit 1.
    estimated.update(estimated_seconds_low=0.001, estimated_seconds_high=0.002)
    (folder / "metrics" / "estimate.json").write_text(json.dumps(estimated))
    (folder / "params.yaml").unlink()  # --recorded runs nothing: no params needed
    out = folder / "judged.json"
    import os

    os.chdir(folder)
    assert main(["verify", "estimate", "--recorded", "--out", str(out)]) == 1
    judged = read(out)
    assert judged["estimate_position"] == "above" and judged["verdict"] == "miss"


def test_judging_without_a_recorded_run_is_one_line(workdir, capsys):
    assert main(["verify", "estimate", "--recorded"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: metrics file metrics/estimate.json does not exist") and err.count("\n") == 1
