"""`buildllm verify memory`: the fitted and held-out sets kept apart, a bounded run for real, and a
miss (a stated range the measurement cannot meet) exits 1."""

from __future__ import annotations

import argparse
import sys

import pytest
from train_fixtures import read

from buildllm.cli import main
from buildllm.memory import estimate as memory_estimate
from buildllm.verify import memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="calibrated for Linux's allocator (glibc)")


def test_held_out_shapes_are_never_fitted_shapes_and_cover_each_kind():
    fitted = {(profile, batch) for profile, batches in memory.FITTED_BATCHES.items() for batch in batches}
    plain = memory.Shape("x", 1)
    for shape in memory.HELD_OUT:
        varied = (shape.architecture, shape.grad_accum, shape.checkpointing, shape.sequence_length, shape.compiled) != (
            plain.architecture,
            plain.grad_accum,
            plain.checkpointing,
            plain.sequence_length,
            plain.compiled,
        )
        assert varied or (shape.profile, shape.batch_size) not in fitted, shape
    assert not {s.label for s in memory.FITTED} & {s.label for s in memory.HELD_OUT}
    kinds = {
        "modern": any(s.architecture == "modern" for s in memory.HELD_OUT),
        "accumulation": any(s.grad_accum > 1 for s in memory.HELD_OUT),
        "checkpointing": any(s.checkpointing for s in memory.HELD_OUT),
        "sequence length": any(s.sequence_length for s in memory.HELD_OUT),
        "odd batch": any(s.batch_size % 2 for s in memory.HELD_OUT),
        "compiled": any(s.compiled for s in memory.HELD_OUT),
        "checkpointed and compiled": any(s.compiled and s.checkpointing for s in memory.HELD_OUT),
    }
    assert all(kinds.values()), kinds
    # Each held-out shape in fp32 and in bf16 (but those committed with issues 21, 33 and 43, each in one precision).
    alone = memory.HELD_OUT_COMMITTED + memory.HELD_OUT_CKPT_COMPILE + memory.HELD_OUT_ACCUM_BF16_CKPT
    alone += memory.HELD_OUT_BF16_CKPT_LARGE
    paired = [s for s in memory.HELD_OUT if s not in alone]
    by_precision = {p: {s.label.replace(p, "") for s in paired if s.precision == p} for p in ("fp32", "bf16")}
    assert by_precision["fp32"] == by_precision["bf16"] and len(by_precision["fp32"]) >= 5


def test_the_bounded_sets_are_drawn_from_the_full_ones_and_stay_apart():
    assert set(memory.BOUNDED["fitted"]) <= set(memory.FITTED)
    assert set(memory.BOUNDED["held_out"]) <= set(memory.HELD_OUT)
    assert memory.BOUNDED["fitted"] and memory.BOUNDED["held_out"]


@pytest.mark.parametrize("bf16_path", [True, False])
def test_the_full_set_leaves_out_only_the_precisions_the_device_refuses(bf16_path, monkeypatch):
    from buildllm.device import cpu_bf16

    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: bf16_path)
    parser = argparse.ArgumentParser()
    memory.add_arguments(parser)
    chosen = memory.chosen_shapes(parser.parse_args(["--full", "--precision", "fp32", "bf16", "fp16"]))
    precisions = {s.precision for shapes in chosen.values() for s in shapes}
    assert precisions == ({"fp32", "bf16"} if bf16_path else {"fp32"})  # fp16: no CPU trains in it
    held_out = [s for s in memory.HELD_OUT if bf16_path or s.precision == "fp32"]
    assert chosen["held_out"] == held_out


@linux_only
@pytest.mark.slow
def test_the_bounded_check_measures_both_sets_and_its_exit_code_follows_the_record(check_params, workdir, capsys):
    code = main(["verify", "memory", "--params", str(check_params), "--profiles", "tiny", "--repeats", "1"])
    record = read(workdir / "metrics" / "verify_memory.json")
    out = capsys.readouterr().out
    assert "fitted set" in out and "held_out set" in out  # printed apart
    assert record["fitted_shapes"] == 1 and record["held_out_shapes"] == 1
    for name in ("fitted_tiny_fp32_b32", "held_out_tiny_fp32_b37"):
        low, high, peak = (record[f"{name}_{part}_bytes"] for part in ("low", "high", "measured"))
        assert record[f"{name}_inside"] == (low <= peak <= high)
        assert peak > 0
    assert code == (1 if record["verdict"] == "miss" else 0)
    assert record["misses"] == 2 - record["fitted_inside"] - record["held_out_inside"]


@linux_only
def test_a_stated_range_the_peak_cannot_meet_is_a_miss_and_exits_1(check_params, workdir, monkeypatch, capsys):
    # A range ending at a hundredth of the estimate: any real peak lies above it.
    monkeypatch.setitem(memory_estimate.SPREAD, "cpu", (0.0, -0.99))
    code = main(
        [
            "verify",
            "memory",
            "--params",
            str(check_params),
            "--profiles",
            "tiny",
            "--sets",
            "held_out",
            "--repeats",
            "1",
            "--out",
            str(workdir / "out" / "memory.json"),
        ]
    )
    record = read(workdir / "out" / "memory.json")
    assert code == 1
    assert record["verdict"] == "miss" and record["held_out_tiny_fp32_b37_inside"] is False
    assert "MISSES the stated range" in capsys.readouterr().out
    assert not (workdir / "metrics" / "verify_memory.json").exists()  # --out, and only there


def test_a_bad_request_is_one_line_and_no_record(check_params, workdir, capsys):
    assert main(["verify", "memory", "--params", str(check_params), "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --repeats 0") and err.count("\n") == 1
    assert not (workdir / "metrics").exists()
