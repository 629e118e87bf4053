"""The train bar's ETA counts measured step time only, and a stop says how to resume for the way the
run was started (the command line, or a DVC stage whose outputs DVC would delete)."""

from __future__ import annotations

import functools
import os
import re
import signal

import pytest
import yaml
from tqdm import tqdm
from train_fixtures import train_args

from buildllm.cli import main
from buildllm.device.device import Device
from buildllm.stage import run_stage
from buildllm.train import loop
from buildllm.train.loop import train
from buildllm.train.trainer import Trainer


class EveryStep(tqdm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, mininterval=0, miniters=1, **kwargs)


def test_validation_time_is_not_step_time_in_the_eta(tokens, workdir, monkeypatch, capsys):
    """Each step takes 1 s and each validation 100 s on a fake clock: the ETA after step n is 20 - n
    seconds; counting the validations would make it minutes. The loop reads the clock only where it
    reads the losses (every log interval, 2 steps here: no per-step device sync), so the ETA shows
    from step 2 on."""
    clock = {"now": 0.0}

    def timed(self):
        return clock["now"]

    step, evaluate = Trainer.step, Trainer.evaluate

    def one_second_step(self):
        clock["now"] += 1.0
        return step(self)

    def slow_evaluate(self):
        clock["now"] += 100.0
        return evaluate(self)

    monkeypatch.setattr(Device, "timed", timed)
    monkeypatch.setattr(Trainer, "step", one_second_step)
    monkeypatch.setattr(Trainer, "evaluate", slow_evaluate)
    # Draw the bar at every step. Not through TQDM_MININTERVAL: tqdm reads its environment once, on
    # import; left at its 0.1 s, a busy machine skipped the draw of a log row's ETA.
    monkeypatch.setattr(loop, "tqdm", EveryStep)
    assert main(train_args(tokens, workdir / "run", "--eval-interval", "2")) == 0
    shown = re.findall(r"eta=(\d\d:\d\d)", capsys.readouterr().err)
    # One ETA a log row, every second step, in order: 18 s left after step 2, ..., none after step 20.
    assert list(dict.fromkeys(shown)) == [f"00:{left:02d}" for left in range(18, -1, -2)], shown


@pytest.fixture
def stop_at_step_3(monkeypatch):
    step = Trainer.step

    def step_then_interrupt(self):
        loss = step(self)
        if self.step_count == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(Trainer, "step", step_then_interrupt)


def test_a_stop_on_the_command_line_says_rerun_the_command(tokens, workdir, stop_at_step_3, capsys):
    assert main(train_args(tokens, workdir / "run")) == 130
    err = capsys.readouterr().err
    assert "stopped at step 3 of 20" in err and "run the same command again to resume" in err


def test_a_stop_under_dvc_says_continue_with_buildllm_train(tokens, workdir, stop_at_step_3, capsys):
    # The stage reads params.yaml alone: the same bounded run as train_args.
    (workdir / "params.yaml").write_text(
        yaml.safe_dump(
            {
                "preset": "tiny",
                "device": "cpu",
                "train": {
                    "threads": 1,
                    "train_tokens": str(tokens["train"]),
                    "validation_tokens": str(tokens["validation"]),
                    "tokenizer": str(tokens["tokenizer"]),
                    "training_examples": 320,
                    "validation_examples": 32,
                    "batch_size": 16,
                    "checkpoint_directory": str(workdir / "run"),
                },
            }
        )
    )
    assert run_stage(functools.partial(train, under_dvc=True)) == 130
    err = capsys.readouterr().err
    assert "stopped at step 3 of 20" in err and "run the same command again" not in err
    assert "`dvc repro train` would start over" in err and "`buildllm train`" in err and "`dvc commit train`" in err


def test_the_summary_and_metrics_carry_the_unigram_level(tokens, workdir, capsys):
    import json
    import math

    import torch

    from buildllm.data.windows import Windows, load_tokens
    from buildllm.train.loop import unigram_loss

    assert main(train_args(tokens, workdir / "run")) == 0
    metrics = json.loads((workdir / "metrics" / "train.json").read_text())
    level = metrics["unigram_validation_loss"]
    out = capsys.readouterr().out
    assert f"unigram level {level:.4f}" in out
    # Below a uniform guess (the text's words are not equally frequent), and the same as a direct count.
    assert level < math.log(metrics["vocab_size"])
    train_tokens, validation_tokens = load_tokens(tokens["train"]), load_tokens(tokens["validation"])
    assert level == pytest.approx(
        unigram_loss(Windows(train_tokens, 64, 320), Windows(validation_tokens, 64, 32), 4096)
    )
    counts = torch.bincount(train_tokens[: 320 * 64 + 1].long(), minlength=4096).double() + 1
    targets = validation_tokens[1 : 32 * 64 + 1].long()
    assert level == pytest.approx(-(counts / counts.sum()).log()[targets].mean().item())
    # Bits per byte: the scored validation targets' own bytes, decoded with the run's tokenizer.
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(str(tokens["tokenizer"])).decode(targets.tolist())
    assert metrics["validation_tokens_scored"] == 32 * 64
    assert metrics["validation_bytes_scored"] == len(text.encode("utf-8"))
    for nats, bits in (
        ("final_validation_loss", "final_validation_bits_per_byte"),
        ("unigram_validation_loss", "unigram_validation_bits_per_byte"),
    ):
        assert metrics[bits] == pytest.approx(metrics[nats] * 32 * 64 / math.log(2) / len(text.encode("utf-8")))
    assert f"{metrics['final_validation_bits_per_byte']:.4f} bits/byte" in out
    rows = json.loads((workdir / "metrics" / "train_log.json").read_text())
    assert rows[-1]["validation_bits_per_byte"] == pytest.approx(metrics["final_validation_bits_per_byte"], rel=1e-5)
