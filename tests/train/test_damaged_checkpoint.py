"""Damaged or unusable checkpoints in real runs: a resume passes over them for the newest intact one
(and ends bitwise where an undisturbed run ends), refuses when none is left, a NaN stop never names
one as the last good checkpoint, generate refuses them in one line; and a checkpoint directory that
is a file is refused in one line."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from train_fixtures import damage, same_tensors, train_args

from buildllm.cli import main
from buildllm.train import checkpoint
from buildllm.train.trainer import Trainer

STEPS = 20  # train_args: 320 examples in batches of 16, a checkpoint every 2 steps


@pytest.fixture(scope="module")
def finished(tokens, tmp_path_factory):
    """One finished 20-step run keeping its last 3 checkpoints (16, 18, 20), copied by each test."""
    folder = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # its metrics/ go there
        assert main(train_args(tokens, folder / "run", "--keep-checkpoints", "3")) == 0
    return folder / "run"


def copy_of(finished, workdir):
    return shutil.copytree(finished, workdir / "run")


def rerun(tokens, run) -> int:
    return main(train_args(tokens, run, "--keep-checkpoints", "3"))


def test_a_damaged_newest_checkpoint_is_passed_over_and_the_resume_ends_where_the_run_did(
    tokens, finished, workdir, capsys
):
    run = copy_of(finished, workdir)
    straight = checkpoint.load(run / checkpoint.checkpoint_name(20))
    damage(run / checkpoint.checkpoint_name(20), random.Random(3))
    assert rerun(tokens, run) == 0
    err = capsys.readouterr().err
    assert (
        f"warning: checkpoint_00000020.pt in {run} is damaged (its bytes differ from the SHA-256 digest saved "
        "in it); trying the one before it, checkpoint_00000018.pt" in err
    )
    assert f"resuming from {run / checkpoint.checkpoint_name(18)} (step 18)" in err
    resumed = checkpoint.load(run / checkpoint.checkpoint_name(20))  # saved again, whole
    assert same_tensors(straight["model"], resumed["model"]) == []
    assert same_tensors(straight["optimizer"], resumed["optimizer"]) == []


def test_a_newest_checkpoint_with_nan_weights_is_passed_over_and_the_learning_rate_not_blamed(
    tokens, finished, workdir, capsys
):
    """The issue's case: resuming from NaN weights stopped with "loss became nan ... lower
    --learning-rate". Whole bytes, NaN weights: the resume takes the checkpoint before it."""
    run = copy_of(finished, workdir)
    straight = checkpoint.load(run / checkpoint.checkpoint_name(20))
    (run / checkpoint.checkpoint_name(20)).unlink()
    broken = checkpoint.load(run / checkpoint.checkpoint_name(18))
    broken["model"]["lm_head.weight"][5, 7] = float("nan")
    checkpoint.save(run, broken, keep=3)
    assert rerun(tokens, run) == 0
    err = capsys.readouterr().err
    assert f"checkpoint_00000018.pt in {run} is unusable (NaN or infinity in weight lm_head.weight)" in err
    assert f"resuming from {run / checkpoint.checkpoint_name(16)} (step 16)" in err
    assert "learning-rate" not in err and "became nan" not in err
    assert same_tensors(straight["model"], checkpoint.load(run / checkpoint.checkpoint_name(20))["model"]) == []


def test_with_no_intact_checkpoint_left_the_run_stops_in_one_line_and_deletes_nothing(
    tokens, finished, workdir, capsys
):
    run = copy_of(finished, workdir)
    for step, seed in ((16, 1), (18, 2), (20, 3)):
        damage(run / checkpoint.checkpoint_name(step), random.Random(seed))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert rerun(tokens, run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: none of the 3 checkpoint(s) in {run} is intact (each is named above) and all are left as "
        "they are; rerun into a fresh --checkpoint-directory"
    )
    assert sum("is damaged" in line for line in err) == 3 and not any("Traceback" in line for line in err)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def poison_at(monkeypatch, at_step: int, action) -> None:
    original = Trainer.step

    def step(self):
        if self.step_count + 1 == at_step:
            action(self)
        return original(self)

    monkeypatch.setattr(Trainer, "step", step)


def nan_weight(trainer) -> None:
    with torch.no_grad():
        trainer.model.blocks[0].mlp.up.weight[0, 0] = float("nan")


@pytest.mark.parametrize("spoil", ["bytes", "weights"])
def test_a_nan_stop_names_the_newest_checkpoint_that_is_intact_and_finite(tokens, workdir, monkeypatch, capsys, spoil):
    """At step 7 the newest checkpoint (6) is damaged (its bytes) or unusable (NaN weights, saved
    whole), and the loss turns NaN: the stop names checkpoint 4, the one a rerun continues from."""
    run = workdir / "run"

    def spoil_then_nan(trainer):
        trainer.wait_for_save()  # checkpoint 6 is written in the background: spoil it once it is there
        newest = run / checkpoint.checkpoint_name(6)
        if spoil == "bytes":
            damage(newest, random.Random(6))
        else:
            state = checkpoint.load(newest)
            state["model"]["lm_head.weight"][0, 0] = float("inf")
            checkpoint.save(run, state, keep=2)
        nan_weight(trainer)

    poison_at(monkeypatch, 7, spoil_then_nan)
    assert main(train_args(tokens, run)) == 3
    err = capsys.readouterr().err
    condition = {"bytes": "damaged", "weights": "unusable"}[spoil]
    assert f"warning: checkpoint_00000006.pt in {run} is {condition} (" in err
    assert "training loss became nan at step 7" in err
    assert f"the last good checkpoint, checkpoint_00000004.pt, is kept in {run}" in err
    assert "checkpoint_00000006.pt, is kept" not in err


@pytest.fixture
def one_checkpoint(finished, workdir):
    """A run directory holding only the finished run's last checkpoint."""
    run = workdir / "gen"
    run.mkdir()
    shutil.copy(finished / checkpoint.checkpoint_name(20), run)
    return run / checkpoint.checkpoint_name(20)


def generate(tokens, location, *extra) -> int:
    args = ["generate", "--checkpoint-directory", str(location), "--prompt", "The", "--max-new-tokens", "5"]
    return main([*args, "--tokenizer", str(tokens["tokenizer"]), *extra])


def test_generate_refuses_a_damaged_checkpoint_in_one_line(tokens, one_checkpoint, capsys):
    damage(one_checkpoint, random.Random(9))
    assert generate(tokens, one_checkpoint) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: checkpoint {one_checkpoint} is damaged (its bytes differ from the SHA-256 digest saved in it); "
        "use another checkpoint or rerun into a fresh --checkpoint-directory"
    ]
    assert generate(tokens, one_checkpoint.parent) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: none of the 1 checkpoint(s) in {one_checkpoint.parent} is intact (each is named above); train "
        "again, or pass --checkpoint-directory of another run"
    )
    assert f"{one_checkpoint.name} in {one_checkpoint.parent} is damaged" in err[0]


def test_generate_from_a_run_passes_over_its_damaged_newest_checkpoint(tokens, finished, workdir, capsys):
    run = copy_of(finished, workdir)
    damage(run / checkpoint.checkpoint_name(20), random.Random(10))
    assert generate(tokens, run) == 0
    captured = capsys.readouterr()
    assert "trying the one before it, checkpoint_00000018.pt" in captured.err
    assert f"{run / checkpoint.checkpoint_name(18)} (step 18)" in captured.err
    # The text is the prompt and what follows it, which may hold a line break (the fixture's text is code).
    text = captured.out.split("\n", 1)[1]  # after the start line's JSON
    assert text.startswith("The") and len(text) > len("The\n")


def test_generate_refuses_nan_weights_and_weights_that_overflow_without_a_traceback(tokens, one_checkpoint, capsys):
    state = checkpoint.load(one_checkpoint)
    state["model"]["lm_head.weight"][1, 2] = float("nan")
    checkpoint.save(one_checkpoint.parent, state, keep=1)
    assert generate(tokens, one_checkpoint) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: checkpoint {one_checkpoint} is unusable (NaN or infinity in weight lm_head.weight); use "
        "another checkpoint or rerun into a fresh --checkpoint-directory"
    )
    # Finite but huge, in a file saved before digests (nothing proves its bytes): the logits overflow,
    # which once ended in torch.multinomial's traceback.
    state["model"]["lm_head.weight"][1, 2] = 0.0
    state["model"] = {k: v * 1e30 if v.is_floating_point() else v for k, v in state["model"].items()}
    torch.save(state, one_checkpoint)
    assert generate(tokens, one_checkpoint) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: the model's output holds NaN or infinity, so no token can be drawn; its checkpoint's weights "
        "are broken: use another checkpoint"
    )
    assert "has no digest" in err[0]


@pytest.mark.parametrize("inside", [False, True])
def test_a_checkpoint_directory_that_is_a_file_is_refused_in_one_line(tokens, workdir, capsys, inside):
    blocker = workdir / "notes.txt"
    blocker.write_text("my notes\n")
    directory = blocker / "run" if inside else blocker
    what = f"lies inside {blocker}, which is a file" if inside else "is a file"
    expected = (
        f"error: --checkpoint-directory {directory} {what}, not a directory: a run saves its checkpoints as "
        "files inside a directory of its own; pass a path that is a directory or does not exist yet, or move "
        "that file away"
    )
    assert main(train_args(tokens, directory)) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected
    assert main(["dry-run", "--preset", "tiny", "--device", "cpu", "--checkpoint-directory", str(directory)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected
    assert blocker.read_text() == "my notes\n" and sorted(p.name for p in workdir.iterdir()) == [
        "metrics",
        "notes.txt",
    ]


def test_the_run_cards_sample_comes_from_the_newest_intact_checkpoint(tokens, finished, workdir, capsys):
    from buildllm.config import load_config
    from buildllm.report.sample import SAMPLE_PATH, write_sample

    run = copy_of(finished, workdir)
    damage(run / checkpoint.checkpoint_name(20), random.Random(11))
    config = load_config(None, {"train.checkpoint_directory": str(run), "train.tokenizer": str(tokens["tokenizer"])})
    write_sample(config)
    sample = json.loads((workdir / SAMPLE_PATH).read_text())
    assert sample["checkpoint"] == checkpoint.checkpoint_name(18) and sample["checkpoint_step"] == 18
    assert f"checkpoint_00000020.pt in {run} is damaged" in capsys.readouterr().err
    for step, seed in ((16, 12), (18, 13)):
        damage(run / checkpoint.checkpoint_name(step), random.Random(seed))
    write_sample(config)
    sample = json.loads((workdir / SAMPLE_PATH).read_text())
    assert "text" not in sample and sample["missing_reason"].startswith(f"none of the 3 checkpoint(s) in {run}")
