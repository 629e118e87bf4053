"""`buildllm preflight`: the course's checks as one table, on a real bounded benchmark and estimate of
the tiny preset; each row's fail or warn is driven by the state it checks (a disk too small, a
benchmark of another plan, a throughput that falls, a battery, a directory in use)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import psutil
import pytest

from buildllm import disk
from buildllm.cli import main
from buildllm.config import load_config
from buildllm.device import health
from buildllm.errors import UserError
from buildllm.measure.benchmark import benchmark
from buildllm.metrics import write_metrics
from buildllm.predict.estimate import estimate
from buildllm.predict.preflight import preflight
from buildllm.train import checkpoint, storage

SETTINGS = {
    "preset": "tiny",
    "device": "cpu",
    "train.threads": 1,
    "train.batch_size": 8,
    "train.training_examples": 64,
    "train.validation_examples": 16,
    "benchmark.warmup_steps": 1,
    "benchmark.measured_steps": 6,
    "benchmark.intervals": 3,
}


def flags(tokens, directory) -> list[str]:
    return [
        "preflight",
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
        "16",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--tokenizer",
        str(tokens["tokenizer"]),
        "--checkpoint-directory",
        str(directory),
    ]


def config_for(tokens, **extra):
    return load_config(
        None,
        {
            **SETTINGS,
            "train.train_tokens": str(tokens["train"]),
            "train.validation_tokens": str(tokens["validation"]),
            "train.tokenizer": str(tokens["tokenizer"]),
            **extra,
        },
    )


@pytest.fixture(scope="module")
def measured(tokens, tmp_path_factory):
    """A real bounded benchmark and estimate of the plan the tests check."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BUILDLLM_CACHE", str(tmp_path_factory.mktemp("cache")))
        patch.chdir(tmp_path_factory.mktemp("measured"))  # the metrics files they write go there
        config = config_for(tokens)
        bench = benchmark(config)
        return bench, estimate(config, bench)


@pytest.fixture
def recorded(measured, workdir):
    bench, projected = measured
    write_metrics(workdir / "metrics" / "benchmark.json", bench)
    write_metrics(workdir / "metrics" / "estimate.json", projected)
    return bench


def rows(output: str) -> dict[str, list[str]]:
    table = [line.strip("|").split(" | ") for line in output.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in table[1:]}


def test_the_table_of_a_benchmarked_plan(tokens, recorded, workdir, capsys):
    assert main(flags(tokens, workdir / "run")) == 0
    out = capsys.readouterr().out
    table = rows(out)
    assert list(table) == [
        "device resolves as intended",
        "precision supported",
        "bounded benchmark ran and fitted",
        "batch size and throughput recorded",
        "estimated runtime and storage",
        "free disk at the checkpoint directory",
        "stable power",
        "stable cooling",
        "checkpoint directory unique",
    ]
    assert table["device resolves as intended"][:2] == ["pass", "cpu -> cpu"]
    assert table["batch size and throughput recorded"][1].startswith(
        f"batch 8: {recorded['tokens_per_second']:,.0f} tok/s"
    )
    assert table["bounded benchmark ran and fitted"][1].startswith("6 steps, peak ")
    assert table["checkpoint directory unique"][:2] == ["pass", f"{workdir / 'run'}: new"]
    m = json.loads((workdir / "metrics" / "preflight.json").read_text())
    assert m["checks_failed"] == 0 and m["disk"] == m["benchmark"] == m["estimate"] == m["directory"] == "pass"
    assert m["tokens_per_second"] == recorded["tokens_per_second"] and 0 < m["disk_needed_bytes"] < m["free_disk_bytes"]
    assert all(len(str(v)) <= 40 for v in m.values())


def test_too_little_disk_fails_with_the_figures(tokens, recorded, workdir, monkeypatch, capsys):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 3 * 2**20)
    assert main(flags(tokens, workdir / "run")) == 2
    captured = capsys.readouterr()
    status, figure, fix = rows(captured.out)["free disk at the checkpoint directory"]
    needed = recorded["checkpoint_bytes"] + storage.LOG_BYTES + 2 * storage.ROW_BYTES  # one save (8 steps), logs
    assert status == "FAIL" and figure == f"3.0 MiB free, needs {needed / 2**20:.1f} MiB"
    assert fix.startswith("0 kept + 1 being written, 1 new × ") and "lower --keep-checkpoints" in fix
    assert "preflight: 1 check(s) failed (free disk at the checkpoint directory)" in captured.err


def test_a_benchmark_of_another_plan_is_refused(tokens, recorded, workdir, capsys):
    assert main(flags(tokens, workdir / "run") + ["--batch-size", "4"]) == 2
    table = rows(capsys.readouterr().out)
    assert table["bounded benchmark ran and fitted"][:2] == ["FAIL", "measured batch_size 8, plan 4"]
    assert table["estimated runtime and storage"][:2] == ["WARN", "stale: batch_size differ"]


def test_a_throughput_falling_interval_after_interval_warns_of_throttling(tokens, recorded, workdir, capsys):
    rates = [10.0, 9.4, 8.9]
    write_metrics(workdir / "metrics" / "benchmark.json", {**recorded, "intervals": 3, **health.interval_trend(rates)})
    preflight(config_for(tokens, **{"train.checkpoint_directory": str(workdir / "run")}))
    status, figure, fix = rows(capsys.readouterr().out)["stable cooling"]
    assert status == "WARN" and figure.startswith("throttling suspected: -11.0% over 3 intervals")
    assert "let the machine cool" in fix
    assert not health.throttling_suspected({"intervals": 3, **health.interval_trend([10.0, 9.9, 10.1])})
    assert not health.throttling_suspected({"intervals": 3, **health.interval_trend([10.0, 9.99, 9.98])})


def test_on_battery_warns(tokens, recorded, workdir, monkeypatch, capsys):
    # What psutil reports for a laptop unplugged at 41% (this machine has no battery).
    unplugged = SimpleNamespace(percent=41, secsleft=3600, power_plugged=False)
    monkeypatch.setattr(psutil, "sensors_battery", lambda: unplugged, raising=False)
    m = preflight(config_for(tokens, **{"train.checkpoint_directory": str(workdir / "run")}))
    assert rows(capsys.readouterr().out)["stable power"][:2] == ["WARN", "on battery, 41%"]
    assert m["power"] == "warn" and m["battery_percent"] == 41 and m["power_plugged"] is False


def test_a_directory_in_use_or_holding_another_run_fails(tokens, recorded, workdir, capsys):
    config = config_for(tokens, **{"train.checkpoint_directory": str(workdir / "run")})
    with checkpoint.DirectoryLock(workdir / "run"):
        with pytest.raises(UserError, match="checkpoint directory unique"):
            preflight(config)
        assert rows(capsys.readouterr().out)["checkpoint directory unique"][:2] == [
            "FAIL",
            f"in use by pid {os.getpid()}",
        ]
    checkpoint.save(workdir / "run", {"step": 4, "model": {}, "signature": {"batch_size": 16}}, keep=2)
    with pytest.raises(UserError):
        preflight(config)
    assert rows(capsys.readouterr().out)["checkpoint directory unique"][1].startswith(
        "holds another run: batch_size 16 -> 8"
    )
    preflight(config, dvc=True)  # DVC's train stage starts its folder afresh


def test_a_checkpoint_directory_that_is_a_file_fails_its_row(tokens, recorded, workdir, capsys):
    (workdir / "run").write_text("not a directory\n")
    with pytest.raises(UserError, match="checkpoint directory unique"):
        preflight(config_for(tokens, **{"train.checkpoint_directory": str(workdir / "run")}))
    assert rows(capsys.readouterr().out)["checkpoint directory unique"] == [
        "FAIL",
        f"{workdir / 'run'} is a file",
        "pass a --checkpoint-directory that is a directory or does not exist yet, or move that file away",
    ]
    assert (workdir / "run").read_text() == "not a directory\n"
