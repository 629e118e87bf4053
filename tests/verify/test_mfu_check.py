"""`buildllm verify mfu`: fresh benchmarks, each MFU recomputed from its own file; a bounded run for
real, and a range no two runs can meet exits 1."""

from __future__ import annotations

import pytest
from train_fixtures import read

from buildllm.cli import main


@pytest.mark.slow
def test_the_bounded_check_compares_fresh_runs_and_its_exit_code_follows_the_record(check_params, workdir):
    code = main(["verify", "mfu", "--params", str(check_params)])
    record = read(workdir / "metrics" / "verify_mfu.json")
    assert record["runs"] == 2 and record["run_1_mfu"] > 0 and record["run_2_mfu"] > 0
    spread = max(record["run_1_mfu"], record["run_2_mfu"]) / min(record["run_1_mfu"], record["run_2_mfu"]) - 1
    assert record["mfu_spread"] == pytest.approx(spread)
    assert code == (0 if spread <= record["tolerance"] else 1)
    assert record["verdict"] == ("inside" if code == 0 else "miss")


@pytest.mark.slow
def test_a_tolerance_no_two_real_runs_meet_is_a_miss_and_exits_1(check_params, workdir, capsys):
    code = main(["verify", "mfu", "--params", str(check_params), "--tolerance", "0", "--out", "mfu.json"])
    record = read(workdir / "mfu.json")
    assert record["mfu_spread"] > 0  # two timed runs never agree to the last bit
    assert code == 1 and record["verdict"] == "miss"
    assert "OUTSIDE the ±0% range" in capsys.readouterr().out


def test_one_run_cannot_be_compared(check_params, capsys):
    assert main(["verify", "mfu", "--params", str(check_params), "--runs", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: --runs 1")
