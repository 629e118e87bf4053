"""The estimate: its arithmetic against a benchmark record, its counts against a real training run,
and its refusals (other controls, an out-of-memory benchmark, no benchmark)."""

from __future__ import annotations

import json

import pytest
from train_fixtures import train_args

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.device.hardware import machine_name
from buildllm.plan.run_plan import facts, make_plan
from buildllm.predict.estimate import RUN_TO_RUN, estimate, planned_examples
from buildllm.units import duration as human_duration


def settings(tokens, **extra) -> dict:
    return {
        "preset": "tiny",
        "device": "cpu",
        "train.threads": 1,
        "train.batch_size": 8,
        "train.grad_accum": 2,
        "train.epochs": 3,
        "train.training_examples": 100,
        "train.validation_examples": 16,
        "train.eval_interval": 4,
        "train.checkpoint_interval": 5,
        "train.keep_checkpoints": 2,
        "train.train_tokens": str(tokens["train"]),
        "train.validation_tokens": str(tokens["validation"]),
        **extra,
    }


def benchmark_record(config, **figures) -> dict:
    """What the benchmark writes: the plan's controls, this machine, and the measured figures."""
    plan = make_plan(config)
    return {
        **facts(plan),
        "machine": machine_name(plan.device),
        "validation_examples": planned_examples(plan, "validation"),
        "oom": False,
        "steps_per_second": 4.0,
        "tokens_per_second": 4096.0,
        "interval_steps_per_second_min": 3.2,
        "interval_steps_per_second_max": 5.0,
        "validation_seconds": 0.5,
        "checkpoint_save_seconds": 0.25,
        "checkpoint_bytes": 1_000_000,
        "process_startup_seconds": 1.5,
        "time_to_first_step_seconds": 2.0,
        "plot_seconds": 0.5,
        **figures,
    }


def test_the_projection_is_the_course_arithmetic(tokens, workdir):
    config = load_config(None, settings(tokens))
    r = estimate(config, benchmark_record(config))
    # 100 examples in batches of 8: 12 micro-batches (the partial one dropped), 6 steps with
    # accumulation 2, times 3 epochs.
    assert r["planned_examples"] == 100 and r["planned_optimizer_steps"] == 18
    assert r["planned_tokens"] == 18 * 8 * 2 * 64
    assert r["estimated_seconds_by_steps"] == pytest.approx(18 / 4.0)
    assert r["estimated_seconds_by_tokens"] == pytest.approx(18 * 8 * 2 * 64 / 4096.0)
    # Validation before training, every 4 steps (4, 8, 12, 16) and after the last step (18).
    assert r["validation_passes"] == 6 and r["validation_overhead_seconds"] == pytest.approx(6 * 0.5)
    # Checkpoints every 5 steps (5, 10, 15) and at the end.
    assert r["checkpoint_saves"] == 4 and r["checkpoint_overhead_seconds"] == pytest.approx(4 * 0.25)
    # Start-up: the process up to the first step, that step, and the loss plot at the end.
    overhead = 6 * 0.5 + 4 * 0.25 + (1.5 + 2.0 + 0.5)
    assert r["startup_seconds"] == pytest.approx(4.0)
    assert r["estimated_seconds"] == pytest.approx(18 / 4.0 + overhead)
    # The fastest and slowest interval, widened by the variation between whole runs.
    # Start-up and the other overheads enter the range as the steps do.
    assert r["estimated_seconds_low"] == pytest.approx((18 / 5.0 + overhead) / (1 + RUN_TO_RUN))
    assert r["estimated_seconds_high"] == pytest.approx((18 / 3.2 + overhead) * (1 + RUN_TO_RUN))
    assert r["run_to_run_spread"] == RUN_TO_RUN > 0
    assert r["checkpoint_storage_bytes"] == 2 * 1_000_000 and r["checkpoint_written_bytes"] == 4 * 1_000_000
    assert all(isinstance(v, (bool, int, float, str)) for v in r.values())


def test_a_configured_startup_replaces_the_measured_one(tokens, workdir):
    config = load_config(None, settings(tokens, **{"estimate.startup_seconds": 30}))
    r = estimate(config, benchmark_record(config))
    assert r["startup_seconds"] == 30.0


def test_counts_match_what_a_real_training_run_does(tokens, workdir):
    # 320 examples in batches of 16: 20 steps; validation every 6, checkpoints every 8.
    run = train_args(
        tokens, workdir / "run", "--eval-interval", "6", "--checkpoint-interval", "8", "--keep-checkpoints", "5"
    )
    assert main(run) == 0
    trained = json.loads((workdir / "metrics" / "train.json").read_text())
    validations = [
        row for row in (workdir / "metrics" / "train_log.csv").read_text().splitlines()[1:] if row.split(",")[3]
    ]
    overrides = {
        "preset": "tiny",
        "device": "cpu",
        "train.threads": 1,
        "train.batch_size": 16,
        "train.training_examples": 320,
        "train.validation_examples": 32,
        "train.eval_interval": 6,
        "train.checkpoint_interval": 8,
        "train.keep_checkpoints": 5,
        "train.train_tokens": str(tokens["train"]),
        "train.validation_tokens": str(tokens["validation"]),
    }
    config = load_config(None, overrides)
    r = estimate(config, benchmark_record(config))
    assert r["planned_optimizer_steps"] == trained["optimizer_steps"] == 20
    assert r["validation_passes"] == len(validations)
    assert r["checkpoint_saves"] == trained["checkpoints_saved"]


def write_benchmark(workdir, record: dict) -> None:
    (workdir / "metrics").mkdir(exist_ok=True)
    (workdir / "metrics" / "benchmark.json").write_text(json.dumps(record))


def cli_args(tokens) -> list[str]:
    return [
        "estimate",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-size",
        "8",
        "--training-examples",
        "100",
        "--validation-examples",
        "16",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
    ]


def test_cli_writes_flat_metrics_and_the_summary(tokens, workdir, capsys):
    config = load_config(None, {**settings(tokens), "train.grad_accum": 1, "train.epochs": 1})
    write_benchmark(workdir, benchmark_record(config))
    assert main(cli_args(tokens)) == 0
    out = capsys.readouterr().out
    assert "planned 12 optimizer steps ÷ 4.00 steps/s" in out and "1 checkpoint × " in out
    saved = json.loads((workdir / "metrics" / "estimate.json").read_text())
    assert saved["planned_optimizer_steps"] == 12 and saved["device"] == "cpu"


def test_refuses_a_benchmark_with_other_controls_and_lists_them(tokens, workdir, capsys, cpu_with_bf16):
    config = load_config(None, {**settings(tokens), "train.grad_accum": 1, "train.batch_size": 16, "precision": "bf16"})
    write_benchmark(workdir, benchmark_record(config))
    assert main(cli_args(tokens)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the benchmark's controls differ from the planned run")
    assert "batch_size 16 (benchmark) vs 8 (plan)" in err and "precision 'bf16' (benchmark) vs 'fp32' (plan)" in err
    assert "dvc repro benchmark" in err and not (workdir / "metrics" / "estimate.json").exists()


def test_refuses_a_benchmark_from_another_machine_validation_size_or_workers(tokens, workdir, capsys):
    config = load_config(None, {**settings(tokens), "train.grad_accum": 1})
    record = benchmark_record(config, machine="Apple M2 Max", validation_examples=64, workers=2)
    write_benchmark(workdir, record)
    assert main(cli_args(tokens)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the benchmark's controls differ from the planned run")
    assert f"machine 'Apple M2 Max' (benchmark) vs {machine_name(make_plan(config).device)!r} (plan)" in err
    assert "validation_examples 64 (benchmark) vs 16 (plan)" in err and "workers 2 (benchmark) vs 0 (plan)" in err
    # The same benchmark taken here, with the planned validation size and workers, is accepted.
    write_benchmark(workdir, benchmark_record(config))
    assert main(cli_args(tokens)) == 0


def test_refuses_an_out_of_memory_benchmark(tokens, workdir, capsys):
    config = load_config(None, {**settings(tokens), "train.grad_accum": 1})
    write_benchmark(workdir, {**facts(make_plan(config)), "oom": True, "oom_batch_size": 8})
    assert main(cli_args(tokens)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ran out of memory" in err and "--batch-size" in err


def test_without_a_benchmark_says_what_to_run(tokens, workdir, capsys):
    assert main(cli_args(tokens)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics/benchmark.json does not exist" in err


def test_human_duration():
    assert human_duration(42.4) == "42 s"
    assert human_duration(3 * 60 + 5) == "3 min 05 s"
    assert human_duration(3300) == "55 min 00 s"
    assert human_duration(2 * 3600 + 7 * 60 + 10) == "2 h 07 min"
