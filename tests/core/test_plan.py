"""The run plan owns every decision: made once, before anything is built, and read (not remade) by
the trainer, the benchmark, the dry run and the startup line."""

from __future__ import annotations

import json
import re

import pytest
from train_fixtures import train_args

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.plan import run_plan
from buildllm.plan.run_plan import facts, make_plan


@pytest.fixture
def probes(monkeypatch):
    """Counts fused AdamW probes wherever they come from."""
    calls = []
    real = run_plan.fused_adamw_support

    def counted(device):
        calls.append(device)
        return real(device)

    monkeypatch.setattr(run_plan, "fused_adamw_support", counted)
    return calls


def test_fused_adamw_is_probed_once_per_training_run(tokens, workdir, probes, capsys):
    assert main(train_args(tokens, workdir / "run", examples=64)) == 0
    assert probes == ["cpu"]
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["fused_adamw"] is True and line["decisions"]["fused_adamw"] == line["fused_adamw_reason"]
    recorded = json.loads((workdir / "metrics" / "train.json").read_text())
    assert recorded["fused_adamw"] is True and recorded["compile_enabled"] is False


def test_fused_adamw_is_probed_once_per_benchmark_and_dry_run(tokens, workdir, probes):
    (workdir / "params.yaml").write_text("benchmark:\n  warmup_steps: 1\n  measured_steps: 2\n  intervals: 1\n")
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
        "--batch-size",
        "8",
    ]
    assert main(["benchmark", *sizes]) == 0
    assert probes == ["cpu"]
    assert main(["dry-run", *sizes]) == 0
    assert probes == ["cpu", "cpu"]


def test_every_decision_is_a_field_with_its_reason():
    plan = make_plan(load_config(None, {"device": "cpu", "preset": "tiny"}), training_examples=640)
    assert plan.planned_steps == 640 // plan.batch_size
    for name in ("device", "precision", "batch_size", "workers", "learning_rate", "threads", "compile", "fused_adamw"):
        assert plan.decisions[name], name
    record = facts(plan)
    assert record["compile_enabled"] is plan.compile.enabled and record["compile_reason"] == plan.compile.reason
    assert record["planned_steps"] == plan.planned_steps and record["processes"] == 1


def test_the_planned_steps_count_every_process_of_a_torchrun(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    plan = make_plan(
        load_config(None, {"device": "cpu", "preset": "tiny", "train.batch_size": 8}), training_examples=64
    )
    assert plan.processes == 2 and plan.planned_steps == 64 // (8 * 2)


def test_commands_offer_only_the_flags_they_use(capsys):
    with pytest.raises(SystemExit):
        main(["benchmark", "--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "--resume",
        "--force",
        "--keep-checkpoints",
        "--checkpoint-interval",
        "--log-interval",
        "--checkpoint-directory",
        "--eval-interval",
    ):
        assert not re.search(re.escape(flag) + r"(?![\w-])", help_text), flag  # --force, not --force-memory
    assert "--batch-size" in help_text and "--memory-budget" in help_text and "--force-memory" in help_text
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--resume" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["benchmark", "--resume"])
    assert refused.value.code == 2 and "unrecognized arguments: --resume" in capsys.readouterr().err


def test_cuda_starts_no_data_loader_workers_unless_asked():
    from buildllm.config import profile_for
    from buildllm.plan.defaults import decide_defaults

    config = load_config(None, {"preset": "student"})
    profile = profile_for(config)
    assert decide_defaults(config.train, profile, "gpu")["workers"][0] == profile.runtime("gpu").workers > 0
    workers, reason = decide_defaults(config.train, profile, "gpu", workers_forked_unsafely=True)["workers"]
    assert workers == 0 and "forkserver" in reason
    asked = load_config(None, {"preset": "student", "train.workers": 2}).train
    assert decide_defaults(asked, profile, "gpu", workers_forked_unsafely=True)["workers"] == (2, "requested: 2")
