"""The bounded default pipeline, end to end with real DVC on the real default corpus: iteration 1
trains on the CPU, writes its metrics, plot file and PNG, and the checkpoint generates text."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest
from conftest import clone_project, run

pytestmark = pytest.mark.slow


def test_dvc_repro_trains_iteration_1_and_the_checkpoint_generates(default_run, tmp_path):
    # `dvc repro train` with the test's own bound (the default trains 8000 examples): 500 examples,
    # 31 steps (conftest's default_run, shared with the dry-run test; this test edits its own clone).
    source, out = default_run
    project = clone_project(source, tmp_path / "project")
    # preflight ran before train, on this pipeline's own benchmark and estimate
    preflight = json.loads((project / "metrics" / "preflight.json").read_text())
    assert preflight["checks_failed"] == 0, out
    assert all(
        preflight[key] == "pass"
        for key in ("device", "precision", "benchmark", "throughput", "estimate", "disk", "directory")
    )
    assert "| free disk at the checkpoint directory | pass |" in out and out.index("| check |") < out.index("trained ")
    metrics = json.loads((project / "metrics" / "train.json").read_text())
    assert metrics["status"] == "completed" and metrics["profile"] == "gpt_first_cpu"
    assert metrics["optimizer_steps"] == 31 and metrics["tokens_processed"] == 31 * 16 * 128  # 500 // 16 steps
    # A model that learned nothing sits at ln(vocab) = 8.3 nats per token.
    assert metrics["final_validation_loss"] < math.log(metrics["vocab_size"]) - 1.0
    assert metrics["final_validation_loss"] < metrics["initial_validation_loss"] - 1.0
    assert 0 < metrics["unigram_validation_loss"] < math.log(metrics["vocab_size"])
    with open(project / "metrics" / "train_log.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["step"] == "0" and rows[-1]["step"] == "31" and rows[-1]["validation_loss"]
    assert (project / "plots" / "train_loss.png").read_bytes()[:4] == b"\x89PNG"

    plots = json.loads(run(["dvc", "plots", "show", "--json"], project).stdout)
    assert {
        "Loss against step",
        "Loss against elapsed time",
        "Tokens per second against step",
        "plots/train_loss.png",
    } <= set(plots["data"])
    assert "train" not in run(["dvc", "status", "train"], project).stdout  # up to date, outs recorded

    text = run(
        [
            sys.executable,
            "-m",
            "buildllm",
            "generate",
            "--prompt",
            "The history of",
            "--max-new-tokens",
            "20",
            "--device",
            "cpu",
        ],
        project,
    ).stdout
    assert json.loads(text.splitlines()[0])["action"] == "generate"  # the startup line, then the text
    text = text.split("\n", 1)[1]
    assert text.startswith("The history of") and len(text.strip()) > len("The history of")

    # Editing a module a stage imports makes DVC see that stage as changed (dvc.yaml deps are derived
    # from imports; tests/test_dvc_deps.py checks every module, this checks DVC reads them so).
    precision = project / "buildllm" / "device" / "precision.py"
    precision.write_text(precision.read_text() + "\n# edited\n")
    status = run(["dvc", "status"], project).stdout
    lines = [line for line in status.splitlines() if line and not line.startswith("\t")]
    changed = {line.strip().rstrip(":").split("@")[0] for line in lines}  # tokenize@4096: tokenize
    assert {"dry_run", "benchmark", "estimate", "train"} <= changed and not {"corpus", "tokenize"} & changed, status
