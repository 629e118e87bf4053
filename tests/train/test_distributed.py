"""torchrun with two CPU processes (gloo): it trains what one process trains with the same global batch, the
ranks exchange losses and stop flags only where losses are read, and a stop on one rank stops both at once."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_fixtures import train_args

from buildllm.train import checkpoint

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd) -> dict:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    with open(cwd / "metrics" / "train_log.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {
        "metrics": json.loads((cwd / "metrics" / "train.json").read_text()),
        "rows": rows,
        "state": checkpoint.load(cwd / "run" / checkpoint.checkpoint_name(20)),
    }


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tokens, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    # The classic recipe: the weights' tolerance below is AdamW's at 2e-3 (tiny's default muon recipe runs
    # AdamW at 1e-2, which moves rare tokens' embedding rows five times as far on the same rounding).
    one_args = train_args(tokens, tmp_path / "one" / "run", "--recipe", "classic")
    single = run([sys.executable, "-m", "buildllm", *one_args], tmp_path / "one")
    # Per-process batch 8 x 2 processes = the single run's 16; each rank reads its half of every batch.
    args = train_args(tokens, tmp_path / "two" / "run", "--batch-size", "8", "--recipe", "classic")
    double = run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "buildllm", *args],
        tmp_path / "two",
    )

    one, two = single["metrics"], double["metrics"]
    assert (two["processes"], two["batch_size"], two["global_batch_size"]) == (2, 8, 16)
    assert two["optimizer_steps"] == one["optimizer_steps"] == 20
    assert two["tokens_processed"] == one["tokens_processed"]
    assert [r["step"] for r in double["rows"]] == [r["step"] for r in single["rows"]]
    for a, b in zip(single["rows"][1:], double["rows"][1:]):
        assert float(b["train_loss"]) == pytest.approx(float(a["train_loss"]), rel=1e-4)
    assert two["final_validation_loss"] == pytest.approx(one["final_validation_loss"], rel=1e-4)
    # AdamW divides by a gradient's root mean square, so where a gradient is near zero the rounding of
    # two processes' averaged gradients can move one weight by ~1e-4 in 20 steps (seen: one of 16,384).
    # Per tensor, the runs agree to 0.1% of the weights' size (a zero-initialised bias: of its movement;
    # 1.1e-4 seen); a missed step or other data would not.
    for name, weight in single["state"]["model"].items():
        assert (double["state"]["model"][name] - weight).norm() <= 1e-3 * weight.norm() + 1e-6, name
    # Only rank 0 wrote: one set of checkpoints, no second lock or temp file.
    assert sorted(p.name for p in (tmp_path / "two" / "run").iterdir()) == [
        checkpoint.checkpoint_name(18),
        checkpoint.checkpoint_name(20),
    ]


def probe(paths, cwd, *extra: str, **env) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Two gloo ranks of 20 steps (batch 8 each), each rank's all_reduce calls noted (torchrun_probe.py)."""
    cwd.mkdir()
    args = train_args(paths, cwd / "run", "--batch-size", "8", "--checkpoint-interval", "0", *extra)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(Path(__file__).with_name("torchrun_probe.py")),
            *args,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    return result, [json.loads((cwd / f"probe_rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_exchange_losses_and_stop_flags_only_where_losses_are_read(tokens, tmp_path):
    result, ranks = probe(tokens, tmp_path / "clean", "--log-interval", "5", "--eval-interval", "10")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    for rank in ranks:
        assert rank["steps"] == 20
        # Nothing inside a step (DDP's gradient buckets are C++, not counted); between steps only at
        # the log rows (5, 10, 15, 20) and the validations (0, 10, 20): never once per step.
        assert not [call for call in rank["calls"] if call["inside_step"]]
        assert {call["step"] for call in rank["calls"]} == {0, 5, 10, 15, 20}
    assert ranks[0]["calls"] == ranks[1]["calls"]


def test_a_sigterm_on_one_rank_stops_both_at_the_next_read_with_one_checkpoint(tokens, tmp_path):
    result, ranks = probe(
        tokens,
        tmp_path / "stop",
        "--log-interval",
        "5",
        "--eval-interval",
        "10",
        PROBE_STOP_RANK="1",
        PROBE_STOP_AFTER="6",
    )
    assert result.returncode != 0
    assert "stopped at step 10 of 20" in result.stderr, result.stderr[-4000:]
    # Rank 1 asked after step 6; the ranks agreed where they next read losses (step 10), not later.
    assert [rank["steps"] for rank in ranks] == [10, 10]
    metrics = json.loads((tmp_path / "stop" / "metrics" / "train.json").read_text())
    assert metrics["status"] == "interrupted" and metrics["optimizer_steps"] == 10
    state = checkpoint.load(tmp_path / "stop" / "run" / checkpoint.checkpoint_name(10))
    assert state["step"] == 10 and state["cursor"]["batch"] == 10
