"""Training in-process on a tiny model: the step, the schedule, the files a run writes, resume rules,
and the stop rules (non-finite loss, out of memory, Ctrl-C)."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch
from train_fixtures import make_token_files, same_tensors, train_args

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.train import checkpoint, run_log
from buildllm.train.schedule import make_schedule
from buildllm.train.trainer import Trainer


@pytest.fixture(scope="module")
def paths(tokens):
    return tokens  # the session's token files (tests/conftest.py), read only


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # metrics/ and plots/ are written relative to the working directory
    return tmp_path


def trainer_for(paths, **overrides) -> Trainer:
    settings = {
        "preset": "tiny",
        "device": "cpu",
        "train.threads": 1,
        "train.batch_size": 16,
        "train.training_examples": 320,
        "train.validation_examples": 32,
        **overrides,
    }
    plan = make_plan(load_config(None, settings))
    apply_plan(plan)
    windows = Windows(load_tokens(paths["train"]), plan.model.sequence_length, plan.config.train.training_examples)
    validation = Windows(load_tokens(paths["validation"]), plan.model.sequence_length, 32)
    return Trainer(plan, windows, validation)


def metrics(workdir) -> dict:
    return json.loads((workdir / "metrics" / "train.json").read_text())


def test_schedule_warms_up_linearly_then_decays_to_the_floor():
    schedule = make_schedule(1.0, total_steps=100, warmup_steps=None, min_ratio=0.1)
    assert schedule.warmup_steps == 5
    assert [round(schedule.rate(s), 6) for s in range(5)] == [0.2, 0.4, 0.6, 0.8, 1.0]
    rates = [schedule.rate(s) for s in range(5, 100)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert schedule.rate(100) == pytest.approx(0.1) and schedule.rate(500) == pytest.approx(0.1)
    assert schedule.rate(5 + 95 // 2) == pytest.approx(0.55, abs=0.02)  # half-way down the cosine


def test_gradient_accumulation_equals_the_larger_batch(paths):
    # Micro-batches of 8 twice take the same examples as one batch of 16, so the steps agree. The classic
    # recipe: the tolerance below is AdamW's at 2e-3; tiny's default muon recipe runs AdamW at 1e-2, which
    # moves the embedding rows of rare tokens five times as far on the same rounding difference.
    classic = {"train.recipe": "classic"}
    big = trainer_for(paths, **classic)
    accumulated = trainer_for(paths, **classic, **{"train.batch_size": 8, "train.grad_accum": 2})
    assert big.planned_steps == accumulated.planned_steps == 20
    initial = {name: weight.clone() for name, weight in big.model.state_dict().items()}
    for _ in range(3):
        assert float(big.step()) == pytest.approx(float(accumulated.step()), rel=1e-5)
    # AdamW divides by the gradient's root mean square, so where a gradient is near zero a rounding
    # difference (two micro-batch sums instead of one) can move a single weight by ~1e-4 in three
    # steps (seen with the plain and the fused loss alike). Per tensor, the two runs' weights agree
    # to 0.1% of how far the three steps moved them (1.7e-4 measured).
    for name, weight in big.model.state_dict().items():
        moved = (weight - initial[name]).norm()
        assert (weight - accumulated.model.state_dict()[name]).norm() <= 1e-3 * moved + 1e-7, name


def test_checkpoint_state_continues_bitwise(paths, tmp_path):
    first = trainer_for(paths, **{"train.checkpoint_directory": str(tmp_path / "ck")})
    for _ in range(4):
        first.step()
    seconds, size = first.save_checkpoint()
    assert seconds > 0 and size == (tmp_path / "ck" / "checkpoint_00000004.pt").stat().st_size
    second = trainer_for(paths)
    second.load_state(checkpoint.load(tmp_path / "ck" / "checkpoint_00000004.pt"))
    for _ in range(3):
        assert float(first.step()) == float(second.step())
    assert same_tensors(first.state()["model"], second.state()["model"]) == []
    assert same_tensors(first.optimizer.state_dict(), second.optimizer.state_dict()) == []


def test_a_run_writes_metrics_log_png_and_keeps_the_last_checkpoints(paths, workdir):
    assert main(train_args(paths, workdir / "run")) == 0
    m = metrics(workdir)
    assert m["status"] == "completed" and m["optimizer_steps"] == m["planned_steps"] == 20
    assert m["tokens_processed"] == 20 * 16 * 64
    # The fixture's text is this project's own source, so the drop moves as the code grows (1.10 nats
    # before the preflight modules, 0.99 after): a clear fall, not an exact figure.
    assert m["final_validation_loss"] < m["initial_validation_loss"] - 0.75
    assert m["validation_perplexity"] == pytest.approx(math.exp(m["final_validation_loss"]))
    assert m["checkpoints_saved"] == 10 and m["checkpoint_bytes"] > 0 and m["fused_adamw"] is True
    assert m["threads"] == 1 and m["device"] == "cpu" and m["precision"] == "fp32"
    assert [p.name for p in checkpoint.list_checkpoints(workdir / "run")] == [
        "checkpoint_00000018.pt",
        "checkpoint_00000020.pt",
    ]
    rows = (workdir / "metrics" / "train_log.csv").read_text().splitlines()
    assert rows[0] == (
        "step,tokens_seen,train_loss,validation_loss,validation_bits_per_byte,learning_rate,tokens_per_second,elapsed_seconds"
    )
    assert [r.split(",")[0] for r in rows[1:]] == [str(s) for s in range(0, 21, 2)]
    assert rows[-1].split(",")[3] != "" and rows[2].split(",")[3] == ""  # validation at step 20, not at 2
    assert (workdir / "plots" / "train_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (workdir / "run" / checkpoint.LOCK).exists()


def test_a_plot_that_cannot_be_drawn_costs_a_warning_not_the_metrics(paths, workdir, monkeypatch, capsys):
    # What CI saw once: after an out-of-memory under `ulimit -v`, matplotlib's shared objects could not be
    # mapped. Not reproducible on demand (it depends on where the heap's blocks fell), so the import fails here.
    def no_room(*_):
        raise ImportError("libXau.so.6: failed to map segment from shared object")

    monkeypatch.setattr(run_log, "write_png", no_room)
    assert main(train_args(paths, workdir / "run")) == 0
    assert metrics(workdir)["status"] == "completed"
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: no loss plot")]
    assert len(warnings) == 1 and "the metrics and the log are still written" in warnings[0]


def test_resume_with_a_different_schedule_is_refused_unless_forced(paths, workdir, capsys):
    assert main(train_args(paths, workdir / "run")) == 0
    capsys.readouterr()
    assert main(train_args(paths, workdir / "run", "--batch-size", "8", "--epochs", "2")) == 2
    error = capsys.readouterr().err
    assert "different schedule (batch_size 16 -> 8; epochs 1 -> 2)" in error
    assert "fresh --checkpoint-directory unless deliberately resuming an identical schedule" in error
    assert main(train_args(paths, workdir / "run", "--epochs", "2", "--force")) == 0
    m = metrics(workdir)
    assert m["resumed_from_step"] == 20 and m["optimizer_steps"] == 40 and m["session_steps"] == 20


def test_elapsed_seconds_run_on_across_a_resume_and_the_json_log_keeps_numbers(paths, workdir):
    """The log's time axis is the whole run's training time: a resumed session continues from what the
    checkpoint saved, so the column never steps back; the JSON twin holds the same rows as numbers."""
    assert main(train_args(paths, workdir / "run")) == 0
    first = json.loads((workdir / "metrics" / "train_log.json").read_text())
    saved = checkpoint.load(workdir / "run" / checkpoint.checkpoint_name(20))["elapsed_seconds"]
    assert first[-1]["step"] == 20 and 0 < first[-1]["elapsed_seconds"] <= saved
    assert main(train_args(paths, workdir / "run", "--epochs", "2", "--force")) == 0
    rows = json.loads((workdir / "metrics" / "train_log.json").read_text())
    assert rows[: len(first)] == first  # the first session's rows, as they were
    elapsed = [row["elapsed_seconds"] for row in rows]
    assert all(isinstance(e, float) for e in elapsed) and elapsed == sorted(elapsed)
    assert rows[len(first)]["step"] == 22 and rows[len(first)]["elapsed_seconds"] > saved
    assert rows[0]["train_loss"] is None and isinstance(rows[0]["validation_loss"], float)
    assert set(rows[0]) == set(rows[1])  # every key in every row: DVC reads the list as data points only then
    csv_rows = (workdir / "metrics" / "train_log.csv").read_text().splitlines()[1:]
    assert [float(r.split(",")[-1]) for r in csv_rows] == elapsed


def test_a_new_run_into_a_directory_with_other_files_is_refused(paths, workdir, capsys):
    (workdir / "run").mkdir()
    (workdir / "run" / "notes.txt").write_text("mine")
    assert main(train_args(paths, workdir / "run")) == 2
    assert "is not empty (notes.txt) and holds no checkpoint" in capsys.readouterr().err
    assert (workdir / "run" / "notes.txt").read_text() == "mine"


def test_fp16_on_the_cpu_is_refused_with_advice(paths, workdir, capsys):
    assert main(train_args(paths, workdir / "run", "--precision", "fp16")) == 2
    assert "precision fp16 requested on the CPU" in capsys.readouterr().err
    assert not (workdir / "metrics" / "train.json").exists()


def poison_at(monkeypatch, at_step: int, action) -> None:
    original = Trainer.step

    def step(self):
        if self.step_count + 1 == at_step:
            action(self)
        return original(self)

    monkeypatch.setattr(Trainer, "step", step)


def test_a_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(paths, workdir, monkeypatch, capsys):
    def corrupt(trainer):
        with torch.no_grad():
            trainer.model.blocks[0].mlp.up.weight[0, 0] = float("nan")

    poison_at(monkeypatch, 7, corrupt)
    assert main(train_args(paths, workdir / "run")) == 3
    error = capsys.readouterr().err
    assert "training loss became nan at step 7" in error and "checkpoint_00000006.pt, is kept" in error
    good = checkpoint.load(workdir / "run" / "checkpoint_00000006.pt")
    assert all(torch.isfinite(t).all() for t in good["model"].values())
    assert metrics(workdir)["status"] == "non_finite_loss" and metrics(workdir)["non_finite_step"] == 7


def test_after_a_stop_the_metrics_report_the_last_validation_with_its_step(paths, workdir, monkeypatch, capsys):
    def corrupt(trainer):
        with torch.no_grad():
            trainer.model.blocks[0].mlp.up.weight[0, 0] = float("nan")

    poison_at(monkeypatch, 14, corrupt)  # validations at steps 0 and 10; the stop at 14
    assert main(train_args(paths, workdir / "run")) == 3
    m = metrics(workdir)
    log = (workdir / "metrics" / "train_log.csv").read_text().splitlines()
    at_10 = next(row.split(",") for row in log if row.startswith("10,"))
    assert m["last_validation_step"] == 10 and m["last_validation_loss"] == pytest.approx(float(at_10[3]), rel=1e-5)
    assert m["last_validation_loss"] < m["initial_validation_loss"]  # not the step-0 value
    assert "final_validation_loss" not in m and "validation_perplexity" not in m
    assert m["final_validation_note"] == "no validation since step 10"
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    capsys.readouterr()
    # --force resumes from step 12 with a lower learning rate: the completed run validates at its end.
    assert main(train_args(paths, workdir / "run", "--learning-rate", "0.0005", "--force")) == 0
    m = metrics(workdir)
    assert m["final_validation_loss"] == m["last_validation_loss"] and m["last_validation_step"] == 20
    assert "final_validation_note" not in m


def test_a_cap_on_validation_examples_is_printed_and_recorded(paths, workdir, capsys):
    available = Windows(load_tokens(paths["validation"]), 64).available
    assert main(train_args(paths, workdir / "capped", examples=32)) == 0  # --validation-examples 32
    assert (
        f"note: train.validation_examples = 32 uses 32 of the {available:,} windows the token file holds"
        in capsys.readouterr().err
    )
    assert metrics(workdir)["validation_examples"] == 32
    assert metrics(workdir)["validation_windows_available"] == available
    assert main(train_args(paths, workdir / "short", "--validation-examples", "100000", examples=32)) == 0
    assert (
        f"asks for more windows than the token file's {available:,}; all {available:,} are used"
        in capsys.readouterr().err
    )
    assert metrics(workdir)["validation_examples"] == available


def test_out_of_memory_gives_the_course_advice_and_records_it(paths, workdir, monkeypatch, capsys):
    def explode(trainer):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    poison_at(monkeypatch, 5, explode)
    assert main(train_args(paths, workdir / "run")) == 3
    error = capsys.readouterr().err
    assert "ran out of memory at step 5 with batch size 16" in error
    assert "reduce --batch-size (e.g. --batch-size 8), record the change" in error
    assert "fresh --checkpoint-directory" in error and "checkpoint_00000004.pt, is kept" in error
    m = metrics(workdir)
    assert m["oom"] is True and m["oom_batch_size"] == 16 and m["oom_step"] == 5 and m["status"] == "out_of_memory"


# Every architecture knob on (docs/pipeline.md); tiny classic's own output layer is tied by params.yaml.
KNOBS_ON = ("--activation", "relu2", "--qk-norm", "--zero-init-projections")


@pytest.mark.parametrize("optimizer, knobs", [("adamw", False), ("muon", False), ("muon", True)])
def test_ctrl_c_saves_a_checkpoint_and_the_rerun_finishes_bitwise_equal(
    paths, workdir, monkeypatch, capsys, optimizer, knobs
):
    chosen = ("--optimizer", optimizer, *(KNOBS_ON if knobs else ()))  # muon: both optimizers' state must come back
    if knobs:
        (workdir / "params.yaml").write_text("model:\n  tied_output: true\n")
    assert main(train_args(paths, workdir / "straight", *chosen)) == 0
    poison_at(monkeypatch, 5, lambda trainer: os.kill(os.getpid(), signal.SIGINT))
    assert main(train_args(paths, workdir / "stopped", "--checkpoint-interval", "0", *chosen)) == 130
    assert "stopped at step 5 of 20; checkpoint saved" in capsys.readouterr().err
    assert [p.name for p in checkpoint.list_checkpoints(workdir / "stopped")] == ["checkpoint_00000005.pt"]
    assert metrics(workdir)["status"] == "interrupted"
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    assert main(train_args(paths, workdir / "stopped", "--checkpoint-interval", "0", *chosen)) == 0
    assert metrics(workdir)["resumed_from_step"] == 5
    straight = checkpoint.load(workdir / "straight" / "checkpoint_00000020.pt")
    resumed = checkpoint.load(workdir / "stopped" / "checkpoint_00000020.pt")
    assert same_tensors(straight["model"], resumed["model"]) == []
    assert same_tensors(straight["optimizer"], resumed["optimizer"]) == []
    assert set(resumed["optimizer"]) == ({"adamw", "muon"} if optimizer == "muon" else {"adamw"})
    built = resumed["model_config"]
    on = (built["activation"], built["qk_norm"], built["zero_init_projections"], built["tied_output"])
    assert on == (("relu2", True, True, True) if knobs else (None, False, False, False))


def test_every_architecture_knob_on_trains(paths):
    knobs = {"model.activation": "relu2", "model.qk_norm": True, "model.zero_init_projections": True}
    trainer = trainer_for(paths, **knobs, **{"model.tied_output": True, "train.optimizer": "muon"})
    assert trainer.model.lm_head.weight is trainer.model.token_embedding.weight
    losses = [float(trainer.step()) for _ in range(8)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_gradient_checkpointing_recomputes_the_same_step(paths):
    plain, recomputed = trainer_for(paths), trainer_for(paths, **{"train.gradient_checkpointing": True})
    assert recomputed.model.gradient_checkpointing
    for _ in range(3):
        assert float(plain.step()) == pytest.approx(float(recomputed.step()), rel=1e-5)


def test_bf16_autocast_on_the_cpu_trains(paths, cpu_with_bf16):
    # The Trainer's bf16 mechanics; on a CPU without a bf16 matmul path its matmuls take the slow kernel.
    trainer = trainer_for(paths, precision="bf16")
    assert trainer.plan.precision.autocast_dtype == torch.bfloat16 and not trainer.scaler.is_enabled()
    losses = [float(trainer.step()) for _ in range(6)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # weights stay fp32


@pytest.mark.slow
def test_compiled_training_saves_plain_weights_that_load_anywhere(paths, tmp_path):
    compiled = trainer_for(paths, **{"train.compile": True, "train.checkpoint_directory": str(tmp_path)})
    plain = trainer_for(paths)
    assert compiled.forward is not compiled.model
    for _ in range(2):
        assert float(compiled.step()) == pytest.approx(float(plain.step()), rel=1e-4)
    compiled.save_checkpoint()
    saved = checkpoint.load(tmp_path / "checkpoint_00000002.pt")
    assert list(saved["model"]) == list(plain.model.state_dict())  # no _orig_mod. prefixes
    fresh = trainer_for(paths)
    fresh.load_state(saved)
    assert float(fresh.step()) == pytest.approx(float(plain.step()), rel=1e-4)


def test_a_tokenizer_for_another_vocabulary_is_refused(tmp_path, workdir, capsys):
    small = make_token_files(tmp_path / "small", vocab_size=512)
    code = main(train_args(small, workdir / "run"))
    assert code == 2
    err = capsys.readouterr().err
    assert "has 512 tokens but the model's vocabulary has 4096" in err
    assert not (workdir / "metrics" / "train.json").exists()


def test_losses_are_read_once_per_log_interval_and_a_nan_between_reads_names_its_step(
    paths, workdir, monkeypatch, capsys
):
    reads, original = [], Trainer.read_losses

    def read_losses(self, losses, *rest):
        reads.append(len(losses))
        return original(self, losses, *rest)

    monkeypatch.setattr(Trainer, "read_losses", read_losses)
    assert (
        main(
            train_args(
                paths, workdir / "clean", "--log-interval", "5", "--checkpoint-interval", "0", "--eval-interval", "0"
            )
        )
        == 0
    )
    assert reads == [5, 5, 5, 5]  # no host-device sync on the steps between log rows

    def corrupt(trainer):
        with torch.no_grad():
            trainer.model.blocks[0].mlp.up.weight[0, 0] = float("nan")

    reads.clear()
    poison_at(monkeypatch, 8, corrupt)
    assert main(train_args(paths, workdir / "run", "--log-interval", "5", "--checkpoint-interval", "3")) == 3
    error = capsys.readouterr().err
    # Read at steps 3 (checkpoint), 5 (log), 6 (checkpoint), 9: the NaN of step 8 is found there, before
    # the checkpoint of step 9 is written.
    assert reads == [3, 2, 1, 3]
    assert "training loss became nan at step 8" in error and "checkpoint_00000006.pt, is kept" in error
    assert metrics(workdir)["non_finite_step"] == 8
