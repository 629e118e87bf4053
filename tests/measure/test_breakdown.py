"""Where a step's time goes: the parts the benchmark times apart, on the Trainer's own step, and the
`--workers` sweep that shows what data-loader workers win back."""

from __future__ import annotations

import pytest

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.measure import breakdown
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train.trainer import Trainer


def trainer_for(tokens, tmp_path, **extra) -> Trainer:
    plan = make_plan(
        load_config(
            None,
            {
                "preset": "tiny",
                "device": "cpu",
                "train.threads": 1,
                "train.batch_size": 8,
                "train.grad_accum": 2,
                **extra,
            },
        )
    )
    apply_plan(plan)
    windows = Windows(load_tokens(tokens["train"]), plan.model.sequence_length, 64)
    return Trainer(plan, windows, directory=tmp_path / "run")


def test_the_parts_are_timed_on_the_trainers_own_step_and_the_trainer_is_left_as_it_was(tokens, tmp_path):
    trainer = trainer_for(tokens, tmp_path)
    trainer.step()
    slow_next = trainer.cursor.next

    def slow_data():  # a data loader that keeps the step waiting: its share must show as data
        import time

        time.sleep(0.05)
        return slow_next()

    trainer.cursor.next = slow_data
    parts = breakdown.step_breakdown(trainer, 3)
    assert trainer.step_count == 4 and set(parts) == {
        "step_data_seconds",
        "step_transfer_seconds",
        "step_compute_seconds",
        "step_optimizer_seconds",
    }
    assert parts["step_data_seconds"] >= 2 * 0.05  # two micro-batches per step, each waited for
    assert parts["step_optimizer_seconds"] > 0 and parts["step_compute_seconds"] > 0
    assert trainer.device is trainer.plan.device and trainer.cursor.next == slow_data
    assert "step" not in vars(trainer.optimizer)  # its own method again
    shares = breakdown.shares({**parts, **breakdown.overheads(trainer.config, 0.4, 0.2)})
    assert sum(shares.values()) == pytest.approx(1.0) and shares["data"] > 0.0


def test_overheads_spread_over_their_intervals():
    config = load_config(None, {"train.eval_interval": 50, "train.checkpoint_interval": 0})
    assert breakdown.overheads(config, 5.0, 3.0) == {"step_validation_seconds": 0.1, "step_checkpoint_seconds": 0.0}


def test_a_workers_sweep_prints_the_table(tokens, workdir, capsys):
    assert (
        main(
            [
                "benchmark",
                "--preset",
                "tiny",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--batch-size",
                "8",
                "--training-examples",
                "64",
                "--validation-examples",
                "8",
                "--train-tokens",
                str(tokens["train"]),
                "--validation-tokens",
                str(tokens["validation"]),
                "--workers",
                "0",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = out[out.index("preset ") :].splitlines()
    assert "workers" in lines[0] and "data wait" in lines[0]
    assert [line.split()[3] for line in lines[2:4]] == ["0", "1"]
