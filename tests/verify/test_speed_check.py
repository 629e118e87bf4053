"""`buildllm verify speed`: the product's step and a bare one on the same model, batch and precision,
taking turns in one process; the exit code follows the overhead's interval against the limit."""

from __future__ import annotations

import pytest
import torch
from train_fixtures import read

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import windows_or_random
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train.trainer import Trainer
from buildllm.verify.bare_step import bare_step

QUICK = ["--rounds", "2", "--steps", "1", "--warmup", "1"]


def test_the_bare_step_trains_the_products_model_on_its_first_batches(tmp_path):
    """Same weights, same batch, same loss at the first step: the two sides differ in the step's
    machinery only. (Their updates differ: the product keeps norms and biases out of weight decay
    and starts its learning rate at the schedule's warm-up.)"""
    plan = make_plan(load_config(None, {"preset": "tiny", "device": "cpu", "train.threads": 1}))
    apply_plan(plan)
    train, _, _ = windows_or_random(plan.config, plan.model, plan.batch_size)
    trainer = Trainer(plan, train, None, directory=tmp_path)
    bare = bare_step(plan, train)
    first = bare()
    assert torch.equal(first, trainer.step())
    later = [float(bare()) for _ in range(3)]
    assert all(loss != float(first) for loss in later)  # its optimizer steps the model it measures


def test_the_check_times_both_steps_and_its_exit_code_follows_the_interval(check_params, workdir, capsys):
    code = main(["verify", "speed", "--params", str(check_params), *QUICK])
    record = read(workdir / "metrics" / "verify_speed.json")
    assert record["rounds"] == 2 and record["bare_seconds_per_step"] > 0 and record["product_seconds_per_step"] > 0
    assert record["overhead_low"] <= record["overhead"] <= record["overhead_high"]
    assert code == (1 if record["overhead_low"] > record["limit"] else 0)
    assert record["verdict"] == ("miss" if code else "inside") and record["profile"] == "tiny"
    assert "product's step over the bare step" in capsys.readouterr().out


def test_a_limit_no_real_step_meets_is_a_miss_and_exits_1(check_params, workdir, capsys):
    # -0.99: the product would have to take a hundredth of the bare step's time.
    code = main(["verify", "speed", "--params", str(check_params), *QUICK, "--limit", "-0.99", "--out", "s.json"])
    record = read(workdir / "s.json")
    assert code == 1 and record["verdict"] == "miss" and record["settled"]
    assert "MISSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"), [(["--rounds", "1"], "--rounds 1: give at least 2"), (["--limit", "-1"], "--limit -1.0")]
)
def test_settings_that_measure_nothing_are_refused_in_one_line(check_params, capsys, flags, message):
    assert main(["verify", "speed", "--params", str(check_params), *flags]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
