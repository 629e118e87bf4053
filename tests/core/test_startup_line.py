"""The first line of train, benchmark, dry-run and generate: one JSON object with what the course asks
a run to make visible before it starts (device and why, precision, fast paths, sizes, planned steps)."""

from __future__ import annotations

import json

import pytest
import yaml
from train_fixtures import train_args

from buildllm.cli import main

FIELDS = (
    "device",
    "device_reason",
    "precision",
    "tensor_cores_enabled",
    "tf32_enabled",
    "fused_adamw",
    "fused_adamw_reason",
    "grad_scaler",
    "batch_size",
    "workers",
    "sequence_length",
    "parameters",
    "planned_steps",
    "decisions",
)


def first_line(capsys) -> dict:
    out = capsys.readouterr().out
    line = json.loads(out.splitlines()[0])
    assert set(FIELDS) <= set(line), set(FIELDS) - set(line)
    assert line["device"] == "cpu" and line["precision"] == "fp32" and line["parameters"] > 0
    assert line["tf32_enabled"] is False and line["tensor_cores_enabled"] is False and line["grad_scaler"] is False
    assert line["device_reason"] and line["fused_adamw_reason"]
    return line


@pytest.fixture
def workdir(workdir):
    (workdir / "params.yaml").write_text(
        yaml.safe_dump({"benchmark": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1}})
    )
    return workdir


def test_train_and_generate_announce_every_field(tokens, workdir, capsys):
    assert main(train_args(tokens, workdir / "run", examples=64)) == 0
    line = first_line(capsys)
    assert line["action"] == "train" and line["planned_steps"] == 4 and line["batch_size"] == 16
    # A value the user set is a decision too, and the device decision carries the device.
    assert line["decisions"]["batch_size"] == "requested: 16" and line["decisions"]["threads"] == "requested: 1"
    assert line["decisions"]["device"] == "cpu: requested explicitly"
    assert (
        main(
            [
                "generate",
                "--checkpoint-directory",
                str(workdir / "run"),
                "--prompt",
                "The",
                "--device",
                "cpu",
                "--max-new-tokens",
                "3",
            ]
        )
        == 0
    )
    line = first_line(capsys)
    assert line["action"] == "generate" and line["planned_steps"] == 3 and line["batch_size"] == 1
    assert line["fused_adamw"] is False and line["decisions"]["device"].startswith("cpu: ")


def test_benchmark_and_dry_run_announce_every_field(tokens, workdir, capsys):
    sizes = [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--training-examples",
        "64",
        "--validation-examples",
        "16",
    ]
    assert main(["benchmark", *sizes, "--batch-size", "8"]) == 0
    line = first_line(capsys)
    assert line["action"] == "benchmark" and line["planned_steps"] == 3 and line["batch_size"] == 8
    assert line["decisions"]["batch_size"] == "requested: 8"
    assert main(["dry-run", *sizes]) == 0
    line = first_line(capsys)
    # The profile's default batch (16 on the CPU) and its reason; 64 examples make 4 steps of 16.
    assert line["action"] == "dry_run" and line["planned_steps"] == 64 // line["batch_size"]
    assert line["decisions"]["batch_size"].endswith("cpu default")
