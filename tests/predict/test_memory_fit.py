"""A plan that cannot fit is refused before anything is allocated: by the dry run (after writing its
figures), the benchmark and train, each in one line that names the estimate, the free memory and the
largest batch that fits; --force-memory tries anyway. The verdict is the plan's, and its largest batch
is exactly the boundary of its own rule."""

from __future__ import annotations

import json

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.memory.estimate import estimate_training_memory, plan_memory
from buildllm.metrics import read_metrics
from buildllm.plan.memory import estimate_at, largest_batch
from buildllm.plan.run_plan import make_plan
from buildllm.predict.fits import GPU

# A batch no machine holds on preset tiny: its estimate is tens of terabytes.
HUGE = 100_000_000


def args(tokens, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--tokenizer",
        str(tokens["tokenizer"]),
        "--training-examples",
        "64",
        "--validation-examples",
        "16",
        *extra,
    ]


def refusal(capsys) -> tuple[str, str]:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this plan does not fit: estimated peak "), err
    line = lines[0]
    assert "available on the host" in line or "left under" in line
    assert "the largest batch that fits is " in line and "--force-memory to try anyway" in line
    return out, line


def test_train_refuses_before_it_makes_anything(tokens, workdir, capsys):
    code = main(["train", *args(tokens, "--batch-size", str(HUGE), "--checkpoint-directory", "run")])
    out, _ = refusal(capsys)
    assert code == 2
    # Refused before the startup line, the checkpoint folder, its lock, metrics or plots.
    assert out == "" and not (workdir / "run").exists()
    assert not (workdir / "metrics").exists() and not (workdir / "plots").exists()


def test_benchmark_refuses_before_it_measures(tokens, workdir, capsys):
    code = main(["benchmark", *args(tokens, "--batch-size", str(HUGE))])
    out, _ = refusal(capsys)
    assert code == 2 and out == "" and not (workdir / "metrics").exists()


def test_the_dry_run_writes_its_figures_then_exits_as_train_would(tokens, workdir, capsys):
    assert main(["dry-run", *args(tokens, "--batch-size", str(HUGE))]) == 2
    out, line = refusal(capsys)
    assert "memory: does not fit: estimated peak" in out
    m = read_metrics(workdir / "metrics" / "dry_run.json", with_notes=True)
    assert m["memory_fits"] is False and m["memory_verdict"] == "does_not_fit"
    assert m["memory_estimate_total_bytes"] > m["memory_usable_bytes"] > 0
    assert m["memory_usable_bytes"] < m["memory_free_bytes"]
    assert f"the largest batch that fits is {m['memory_largest_batch_size']}:" in line
    assert m["memory_fit_reason"].startswith("does not fit:")
    # --force-memory: the same figures, and the dry run succeeds (train would try).
    assert main(["dry-run", *args(tokens, "--batch-size", str(HUGE), "--force-memory")]) == 0
    m = read_metrics(workdir / "metrics" / "dry_run.json")
    assert m["memory_fits"] is False and m["force_memory"] is True


def test_a_plan_that_fits_says_so_everywhere(tokens, workdir, capsys):
    assert main(["dry-run", *args(tokens, "--batch-size", "8")]) == 0
    startup = json.loads(capsys.readouterr().out.splitlines()[0])
    assert startup["memory_fits"] is True and startup["memory_verdict"] in ("fits", "tight")
    assert startup["decisions"]["memory"].split(":")[0] in ("fits", "may not fit")
    m = read_metrics(workdir / "metrics" / "dry_run.json")
    assert m["memory_fits"] is True and m["memory_largest_batch_size"] >= 8


def test_the_largest_batch_is_the_boundary_of_the_verdicts_rule(tokens):
    for extra in ({}, {"train.gradient_checkpointing": True, "train.grad_accum": 2}):
        plan = make_plan(
            load_config(
                None,
                {
                    "preset": "tiny",
                    "device": "cpu",
                    "train.batch_size": HUGE,
                    "train.train_tokens": str(tokens["train"]),
                    **extra,
                },
            )
        )
        fit = plan.memory
        largest, usable = fit.largest_batch_size, fit.usable_bytes
        assert not fit.fits and 0 < largest < HUGE

        def total(batch: int, plan=plan, usable=usable) -> int:
            return estimate_at(
                plan.model,
                plan.parameters,
                batch,
                4,
                plan.device,
                usable,
                plan.config.train.gradient_checkpointing,
                plan.config.train.grad_accum,
                plan.muon_parameters,
            ).total

        assert total(largest) <= usable < total(largest + 1)
        assert fit.estimate_bytes == total(HUGE) > usable


def test_a_run_that_saves_before_its_last_step_counts_the_checkpoints_host_copy(tokens):
    """The background save's host copy of the weights and optimizer state, made at the first mid-run save,
    is kept for the rest of the run: on host memory the estimate counts it, for the training run only,
    and only where a save comes before the last step (64 windows at batch 8: 8 steps)."""

    def plan(interval: int):
        settings = {
            "preset": "tiny",
            "device": "cpu",
            "train.batch_size": 8,
            "train.training_examples": 64,
            "train.train_tokens": str(tokens["train"]),
            "train.checkpoint_interval": interval,
        }
        return make_plan(load_config(None, settings))

    saving = plan(2)
    assert saving.planned_steps == 8
    estimate = plan_memory(saving)
    assert estimate.checkpoint_copy == estimate.weights + estimate.optimizer > 0
    assert saving.memory.estimate_bytes == estimate.total
    steps_only = plan_memory(saving, training=False)  # a benchmark's steps save nothing
    assert steps_only.checkpoint_copy == 0 and estimate.total - steps_only.total == estimate.checkpoint_copy
    for interval in (0, 8, 100):  # never, or only after the last step
        assert plan_memory(plan(interval)).checkpoint_copy == 0
        assert plan(interval).memory.estimate_bytes == steps_only.total
    # The largest batch that fits leaves room for the copy: in exactly this estimate's bytes, batch 8.
    shape = (saving.model, saving.parameters, 4, estimate.total, saving.device)
    muon = saving.muon_parameters
    assert largest_batch(*shape, muon_parameters=muon, saves_while_training=True) == 8
    assert largest_batch(*shape, muon_parameters=muon) > 8
    # A GPU's copy is in host memory: the device's estimate has none.
    model, parameters = saving.model, saving.parameters
    on_gpu = estimate_training_memory(model, parameters, 8, 2, GPU, loss_chunk_rows=1024, saves_while_training=True)
    assert on_gpu.checkpoint_copy == 0
